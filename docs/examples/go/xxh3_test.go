package main

import "testing"

// Vectors from the Python xxhash package (an independent implementation):
// xxhash.xxh3_64_intdigest(bytes((i*7+3) % 251 for i in range(n))).
func TestXXH3MatchesAnIndependentImplementation(t *testing.T) {
	cases := []struct {
		n    int
		want uint64
	}{
		{0, 0x2d06800538d394c2}, {1, 0x13e608bc156defed}, {2, 0x1c9074b93943b86c},
		{3, 0xa9088dda485b481c}, {4, 0x6d9253b16c8b1ed3}, {7, 0x8e8291ad89127e2e},
		{8, 0x60539db630471163}, {9, 0xfeff668361d723a8}, {15, 0x9ec169f4a98231c1},
		{16, 0xb8c859b0f030b585}, {17, 0x714a04408e79b80f}, {31, 0xed41ac283d0674b3},
		{32, 0x19ff4ee1d6ba1a55}, {33, 0x3e44983ad21679c8}, {63, 0x1eee67c658468aa1},
		{64, 0x38bcde5122f74956}, {65, 0x95a166c5957453d9}, {95, 0x8176f0efd0635875},
		{96, 0x75d654bdaee123df}, {97, 0x1296f9e2421ab74c}, {127, 0x9311efee0d3943c9},
		{128, 0x4634ae6a253a60e4}, {129, 0xc095b9b1b087722d}, {130, 0x3a731d1b00521edd},
		{143, 0x08c9b0a35fa91361}, {144, 0xbc948c7dc4355668}, {200, 0xa369f2930049476f},
		{239, 0xbe90938dbe3946ee}, {240, 0x887af00281f75d38},
	}
	for _, c := range cases {
		in := make([]byte, c.n)
		for i := range in {
			in[i] = byte((i*7 + 3) % 251)
		}
		got, err := xxh3(in)
		if err != nil || got != c.want {
			t.Errorf("len %d: got %#016x, %v; want %#016x", c.n, got, err, c.want)
		}
	}
	if _, err := xxh3(make([]byte, 241)); err == nil {
		t.Error("241 bytes: want an error")
	}
}

// The test vectors of docs/protocol.md.
func TestTheProtocolDocsVectors(t *testing.T) {
	llama := []uint32{128000, 9906, 1917, 13, 220, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1001}
	tokens := []uint32{}
	for i := uint32(0); i < 16; i++ {
		tokens = append(tokens, i)
	}
	tokens = append(tokens, llama...)
	tokens = append(tokens, 7, 7, 7)
	key, err := TokenKey(tokens, 16)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0x79c2079c74a8ee4d, 0xab0ad845cfd79968}
	if len(key) != 2 || key[0] != want[0] || key[1] != want[1] {
		t.Errorf("token key %#x, want %#x", key, want)
	}
}

func TestScoresArePrefixShares(t *testing.T) {
	scores := Scores(4, []Match{{"a", 4}, {"b", 1}}, []string{"a", "b", "c"})
	want := map[string]float64{"a": 1, "b": 0.25, "c": 0}
	for pod, s := range want {
		if scores[pod] != s {
			t.Errorf("%s: %v, want %v", pod, scores[pod], s)
		}
	}
	if s := Scores(0, nil, []string{"a"}); s["a"] != 0 {
		t.Errorf("an empty key scores 0, got %v", s["a"])
	}
}
