package main

import "testing"

// vector is the hash wanted of bytes((i*7+3) % 251 for i in range(n)).
type vector struct {
	n    int
	want uint64
}

// checkVectors holds hash to each of cases.
func checkVectors(t *testing.T, hash func([]byte) (uint64, error), cases []vector) {
	t.Helper()
	for _, c := range cases {
		in := make([]byte, c.n)
		for i := range in {
			in[i] = byte((i*7 + 3) % 251)
		}
		got, err := hash(in)
		if err != nil || got != c.want {
			t.Errorf("len %d: got %#016x, %v; want %#016x", c.n, got, err, c.want)
		}
	}
}

// Vectors from the Python xxhash package (an independent implementation):
// xxhash.xxh3_64_intdigest(bytes((i*7+3) % 251 for i in range(n))).
func TestXXH3MatchesAnIndependentImplementation(t *testing.T) {
	cases := []vector{
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
	checkVectors(t, xxh3, cases)
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
	matches := []Match{
		{"a", 4, 0, "gateway", ReceiptCounts{}},
		{"b", 1, 0, "exact", ReceiptCounts{}},
		{"c", 2, 2, "exact", ReceiptCounts{}},
		{"d", 4, 0, "learning", ReceiptCounts{}},
		{"e", 0, 4, "speculative", ReceiptCounts{}},
		{"g", 4, 0, "suspect", ReceiptCounts{Over: 8}},
	}
	scores := Scores(4, matches, []string{"a", "b", "c", "d", "e", "f", "g"}, 0.5)
	want := map[string]float64{"a": 1, "b": 0.25, "c": 0.75, "d": 0, "e": 0.5, "f": 0, "g": 0}
	for pod, s := range want {
		if scores[pod] != s {
			t.Errorf("%s: %v, want %v", pod, scores[pod], s)
		}
	}
	if s := Scores(0, nil, []string{"a"}, LowerWeight); s["a"] != 0 {
		t.Errorf("an empty key scores 0, got %v", s["a"])
	}
}

// Seeded: xxhash.xxh3_64_intdigest(bytes(...), seed=0x3b490f35e06e9357).
func TestSeededXXH3MatchesAnIndependentImplementation(t *testing.T) {
	const seed = 0x3b490f35e06e9357
	cases := []vector{
		{0, 0xba2d11eae7b3e7e0}, {1, 0x7d357acea71b7c7e}, {2, 0x81f503d5658c75d3},
		{3, 0xe5e7c609d32436fd}, {4, 0x743d3fb4095a835b}, {7, 0xd036d2d1536de2d1},
		{8, 0x325512fbb35e6eec}, {9, 0x8642941310d84395}, {15, 0x55b25baf2df0d7e3},
		{16, 0x3e69bd6f09bba015}, {17, 0x7315442265bdbf14}, {31, 0x11f89cea0e708534},
		{32, 0x9b71103e1a1ce542}, {33, 0x4df5c0fc405f3094}, {63, 0x6418d92f2420fd04},
		{64, 0xd58ba423ff522290}, {65, 0xde85e2200c689843}, {95, 0xc46caa8c6e3e7e9a},
		{96, 0x407ccb40e9148cfc}, {97, 0x6dbff9822addba15}, {127, 0x72e9d80ca651a90c},
		{128, 0x2f50d99159e7e2ab}, {129, 0x00e471d2dbe3f0b7}, {130, 0x7d95a09da6d90f20},
		{143, 0x49b57789cf699f03}, {144, 0x593a3a2189f0f0de}, {200, 0x6d8e1ee86d27cc6d},
		{239, 0xe97db4c2a60773da}, {240, 0xf474beb87183cd31},
	}
	checkVectors(t, func(in []byte) (uint64, error) { return xxh3Seeded(in, seed) }, cases)
}

// The identity vectors of docs/protocol.md ("Keys").
func TestTheProtocolDocsIdentityVectors(t *testing.T) {
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	salted, err := TokenKeyWith(tokens, 16, Identity{CacheSalt: "tenant-a"})
	if err != nil || salted[0] != 0xac64a7d7a02b4a1e {
		t.Errorf("salted: %#x, %v", salted, err)
	}
	image := Identity{MmItems: []MmItem{{"img-a", 8, 16}}}
	key, err := TokenKeyWith(tokens, 16, image)
	if err != nil || len(key) != 2 || key[0] != 0xa281ce7bd569058d || key[1] != 0x06de7ad12d1cf9ac {
		t.Errorf("image: %#x, %v", key, err)
	}
	image.CacheSalt = "tenant-a"
	both, err := TokenKeyWith(tokens, 16, image)
	if err != nil || both[0] != 0xd40725c848688234 {
		t.Errorf("image and salt: %#x, %v", both, err)
	}
	items, err := parseMmItems("sha256:ab:3:40, x:1:2")
	if err != nil || len(items) != 2 || items[0] != (MmItem{"sha256:ab", 3, 40}) {
		t.Errorf("parse: %v, %v", items, err)
	}
	for _, bad := range []string{"a:1", ":1:2", "a:x:2"} {
		if _, err := parseMmItems(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}
