// Command prefixscorer is an endpoint-picker-style scorer over the
// prefix-index HTTP/JSON API, written with Go's standard library only.
//
// Score one prompt's token ids among candidate pods:
//
//	go run . -server https://localhost:8443 -ca prefix-index-data/cert.pem \
//	    -model m -pods pod-a,pod-b -tokens 1,2,3,...
//
// With -demo it records two pods' prefixes, scores a prompt among three
// pods, checks that its own hashing agrees with the server's, prints the
// scores as JSON and exits non-zero on any disagreement (CI runs this).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	server := flag.String("server", "https://localhost:8443", "the server's HTTP/JSON API")
	ca := flag.String("ca", "prefix-index-data/cert.pem", "PEM CA to trust (the server's cert.pem)")
	cert := flag.String("cert", "", "client certificate (mutual TLS)")
	key := flag.String("key", "", "the client certificate's key")
	model := flag.String("model", "m", "model")
	pods := flag.String("pods", "pod-a,pod-b,pod-c", "candidate pods, comma-separated")
	tokens := flag.String("tokens", "", "the prompt's token ids, comma-separated")
	block := flag.Int("block-tokens", 16, "token ids per block (the server's --token-block)")
	salt := flag.String("cache-salt", "", "the request's cache_salt, as given to vLLM")
	mm := flag.String("mm-items", "", "the request's multimodal items, IDENTIFIER:OFFSET:LENGTH,... in token positions")
	demo := flag.Bool("demo", false, "record prefixes, score, and check the hashing against the server")
	flag.Parse()

	c, err := NewClient(*server, *ca, *cert, *key, 2*time.Second)
	if err != nil {
		fail(err)
	}
	var candidates []string
	for _, p := range strings.Split(*pods, ",") {
		if p = strings.TrimSpace(p); p != "" {
			candidates = append(candidates, p)
		}
	}
	if *demo {
		if err := runDemo(c, *model, candidates, *block); err != nil {
			fail(err)
		}
		return
	}
	ids, err := parseTokens(*tokens)
	if err != nil {
		fail(err)
	}
	items, err := parseMmItems(*mm)
	if err != nil {
		fail(err)
	}
	scores, err := score(c, *model, ids, Identity{CacheSalt: *salt, MmItems: items}, candidates, *block)
	if err != nil {
		fail(err)
	}
	print(scores)
}

func score(c *Client, model string, tokens []uint32, id Identity, candidates []string, block int) (map[string]float64, error) {
	key, err := TokenKeyWith(tokens, block, id)
	if err != nil {
		return nil, err
	}
	l, err := c.LookupHashes(model, key, candidates)
	if err != nil {
		return nil, err
	}
	return Scores(l.KeyBlocks, l.Matches, candidates, LowerWeight), nil
}

// runDemo: pod-a holds the prompt's first 4 blocks (recorded as token ids,
// hashed by the server), pod-b its first 2 (hashed here); the prompt has 6
// full blocks, so the scores must be 4/6, 2/6 and 0. Then the same prompt
// with a cache salt and an image, hashed here and by the server: only
// pod-c, which holds it so, matches it.
func runDemo(c *Client, model string, candidates []string, block int) error {
	if len(candidates) != 3 {
		return fmt.Errorf("the demo takes 3 pods")
	}
	prompt := make([]uint32, 6*block+5)
	for i := range prompt {
		prompt[i] = uint32(100000 + 7*i)
	}
	if err := c.Insert(model, candidates[0], nil, prompt[:4*block]); err != nil {
		return err
	}
	mine, err := TokenKey(prompt[:2*block], block)
	if err != nil {
		return err
	}
	if err := c.Insert(model, candidates[1], mine, nil); err != nil {
		return err
	}
	scores, err := score(c, model, prompt, Identity{}, candidates, block)
	if err != nil {
		return err
	}
	want := map[string]float64{candidates[0]: 4.0 / 6, candidates[1]: 2.0 / 6, candidates[2]: 0}
	for pod, w := range want {
		if scores[pod] != w {
			return fmt.Errorf("%s scored %v, want %v: this example's hashing and the server's disagree", pod, scores[pod], w)
		}
	}
	byServer, err := c.LookupTokens(model, prompt, Identity{}, candidates)
	if err != nil {
		return err
	}
	if fmt.Sprint(Scores(byServer.KeyBlocks, byServer.Matches, candidates, LowerWeight)) != fmt.Sprint(scores) {
		return fmt.Errorf("lookups by token ids and by this example's hashes differ")
	}
	tenant := Identity{CacheSalt: "tenant-a", MmItems: []MmItem{{"img-1", uint32(block + 3), uint32(2 * block)}}}
	salted, err := TokenKeyWith(prompt, block, tenant)
	if err != nil {
		return err
	}
	if err := c.Insert(model, candidates[2], salted, nil); err != nil {
		return err
	}
	byServer, err = c.LookupTokens(model, prompt, tenant, candidates)
	if err != nil {
		return err
	}
	got := Scores(byServer.KeyBlocks, byServer.Matches, candidates, LowerWeight)
	if got[candidates[2]] != 1 || got[candidates[0]] != 0 || got[candidates[1]] != 0 {
		return fmt.Errorf("a salted request with an image scored %v: this example's identity rule and the server's disagree", got)
	}
	// Over a limit: the server's error carries the protocol's code and name.
	_, err = c.LookupHashes(model, make([]uint64, 100000), candidates)
	if e, ok := err.(*APIError); !ok || e.Status != 422 || e.Name == nil || *e.Name != "key_too_long" {
		return fmt.Errorf("an over-long key: want HTTP 422 key_too_long, got %v", err)
	}
	// Receipts: the engine behind candidates[0] reused 1 of the 4 blocks
	// promised, eight times (--receipt-suspect's default): the index's
	// answer for it is suspect, and it scores 0 until receipts agree.
	for i := 0; i < 8; i++ {
		if err := c.Receipt(model, candidates[0], prompt, 4, uint32(block)); err != nil {
			return err
		}
	}
	byServer, err = c.LookupTokens(model, prompt, Identity{}, candidates)
	if err != nil {
		return err
	}
	for _, m := range byServer.Matches {
		if m.Pod == candidates[0] && (m.View != "suspect" || m.Receipts.Over != 8) {
			return fmt.Errorf("after 8 over-predicted receipts %s is %q with %+v, want suspect", m.Pod, m.View, m.Receipts)
		}
	}
	if s := Scores(byServer.KeyBlocks, byServer.Matches, candidates, LowerWeight); s[candidates[0]] != 0 {
		return fmt.Errorf("a suspect pod scored %v, want 0", s[candidates[0]])
	}
	print(scores)
	return nil
}

func parseTokens(s string) ([]uint32, error) {
	var ids []uint32
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %q: %v", f, err)
		}
		ids = append(ids, uint32(n))
	}
	return ids, nil
}

func print(scores map[string]float64) {
	out, _ := json.Marshal(scores)
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "prefixscorer:", err)
	os.Exit(1)
}
