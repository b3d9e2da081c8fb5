package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// TokenKey is the key of a token-id prompt: one hash per full block of
// blockTokens ids, each id as 4 little-endian bytes, hashed with XXH3-64
// (seed 0). A trailing partial block is dropped: engines reuse only full
// KV blocks.
func TokenKey(tokens []uint32, blockTokens int) ([]uint64, error) {
	return TokenKeyWith(tokens, blockTokens, Identity{})
}

// Match is one pod's answer to a detailed lookup: its matched leading
// blocks, the run after them that a lower cache tier (CPU memory, storage)
// holds, and how far the answer can be trusted.
type Match struct {
	Pod         string `json:"pod"`
	Blocks      uint32 `json:"blocks"`
	LowerBlocks uint32 `json:"lower_blocks"`
	View        string `json:"view"`
	// The pod's recent receipts (see Receipt), by outcome.
	Receipts ReceiptCounts `json:"receipts"`
}

// ReceiptCounts counts a pod's recent receipts: the engine reused what the
// index predicted, less (over), or more (under).
type ReceiptCounts struct {
	Exact uint32 `json:"exact"`
	Over  uint32 `json:"over"`
	Under uint32 `json:"under"`
}

// LowerWeight is what a block a lower tier holds is worth beside one on
// the GPU: the engine reloads it rather than computing it, which costs a
// copy. 0.8 is llm-d's default for CPU memory (Dynamo weighs host memory
// 0.75 and disk 0.25).
const LowerWeight = 0.8

// Scores turns a lookup's matches into scores in [0, 1], as the endpoint
// pickers' prefix scorers do: the share of the prompt's blocks a pod
// already holds, a lower tier's blocks weighed by lowerWeight. A pod whose
// view is not to be trusted right now (its engine's events are being
// learnt again, replayed or not received, or its receipts say the index
// over-predicts it) scores 0, so that the picker's other scorers (load)
// decide for it. Candidates with no match score 0.
func Scores(keyBlocks uint32, matches []Match, candidates []string, lowerWeight float64) map[string]float64 {
	scores := make(map[string]float64, len(candidates))
	for _, pod := range candidates {
		scores[pod] = 0
	}
	if keyBlocks == 0 {
		return scores
	}
	for _, m := range matches {
		if _, ok := scores[m.Pod]; !ok {
			continue
		}
		switch m.View {
		case "learning", "replaying", "disconnected", "suspect":
			continue
		}
		held := float64(m.Blocks) + lowerWeight*float64(m.LowerBlocks)
		scores[m.Pod] = held / float64(keyBlocks)
	}
	return scores
}

// Client calls the prefix-index HTTP/JSON API (docs/http.md).
type Client struct {
	base string
	http *http.Client
}

// APIError is the server's error object: the protocol's code and name.
type APIError struct {
	Status  int
	Code    *int    `json:"code"`
	Name    *string `json:"name"`
	Message string  `json:"message"`
}

func (e *APIError) Error() string {
	name := "none"
	if e.Name != nil {
		name = *e.Name
	}
	return fmt.Sprintf("HTTP %d, %s: %s", e.Status, name, e.Message)
}

// NewClient trusts the PEM CA at caPath (the server's cert.pem, or its CA)
// and, when certPath is set, presents that client certificate (mutual TLS).
func NewClient(base, caPath, certPath, keyPath string, timeout time.Duration) (*Client, error) {
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", caPath)
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
	if certPath != "" {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	transport := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16}
	return &Client{base: base, http: &http.Client{Transport: transport, Timeout: timeout}}, nil
}

func (c *Client) call(path string, body any, answer any) error {
	var req *http.Request
	var err error
	if body == nil {
		req, err = http.NewRequest(http.MethodGet, c.base+path, nil)
	} else {
		b, merr := json.Marshal(body)
		if merr != nil {
			return merr
		}
		req, err = http.NewRequest(http.MethodPost, c.base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
	}
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error APIError `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil {
			return fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
		}
		e.Error.Status = resp.StatusCode
		return &e.Error
	}
	return json.Unmarshal(raw, answer)
}

// Lookup is a lookup's answer.
type Lookup struct {
	KeyBlocks uint32  `json:"key_blocks"`
	Matches   []Match `json:"matches"`
}

// LookupHashes asks which candidates hold leading blocks of key, with
// their lower tiers and views (a detailed lookup).
func (c *Client) LookupHashes(model string, key []uint64, candidates []string) (Lookup, error) {
	var l Lookup
	err := c.call("/v1/lookup-detail", map[string]any{"model": model, "hashes": key, "candidates": candidates}, &l)
	return l, err
}

// LookupTokens leaves the hashing to the server, identity included.
func (c *Client) LookupTokens(model string, tokens []uint32, id Identity, candidates []string) (Lookup, error) {
	body := map[string]any{"model": model, "tokens": tokens, "candidates": candidates}
	if id.CacheSalt != "" {
		body["cache_salt"] = id.CacheSalt
	}
	if len(id.MmItems) > 0 {
		body["mm_items"] = id.MmItems
	}
	if id.PromptEmbeds != nil {
		digests := make([]string, len(id.PromptEmbeds))
		for i, d := range id.PromptEmbeds {
			digests[i] = hex.EncodeToString(d)
		}
		body["prompt_embeds"] = digests
	}
	var l Lookup
	err := c.call("/v1/lookup-detail", body, &l)
	return l, err
}

// Insert records that pod holds every prefix of the key (hashes or tokens).
func (c *Client) Insert(model, pod string, key []uint64, tokens []uint32) error {
	body := map[string]any{"model": model, "pod": pod}
	switch {
	case key != nil:
		body["hashes"] = key
	case tokens != nil:
		body["tokens"] = tokens
	default:
		return fmt.Errorf("insert: give a key or token ids")
	}
	var ok struct{}
	return c.call("/v1/insert", body, &ok)
}

// Receipt reports, after a request, what the engine reused of its prompt
// (cachedTokens: vLLM's usage.prompt_tokens_details.cached_tokens) beside
// predicted, the blocks the lookup answered for pod when the request was
// routed there. The server counts it for the pod; a pod whose receipts
// over-predict is shown "suspect" (docs/operations.md, "Receipts").
func (c *Client) Receipt(model, pod string, tokens []uint32, predicted, cachedTokens uint32) error {
	body := map[string]any{
		"model": model, "pod": pod, "tokens": tokens,
		"predicted_blocks": predicted, "cached_tokens": cachedTokens,
	}
	var ok struct{}
	return c.call("/v1/receipt", body, &ok)
}
