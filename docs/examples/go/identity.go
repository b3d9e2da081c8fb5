package main

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// MmItem is a multimodal item of a request (an image, an audio clip): its
// placeholder tokens are Offset .. Offset+Length-1 of the prompt, and
// Identifier is what the gateway passes to vLLM as its multi_modal_uuids
// entry (or vLLM's own hash of the item).
type MmItem struct {
	Identifier string `json:"identifier"`
	Offset     uint32 `json:"offset"`
	Length     uint32 `json:"length"`
}

// Identity is what besides its token ids identifies a request's blocks
// (docs/protocol.md, "Keys"): the zero value is a plain request.
type Identity struct {
	// CacheSalt is the request's cache_salt; it enters the first block.
	CacheSalt string
	// MmItems are the request's multimodal items.
	MmItems []MmItem
	// PromptEmbeds are the per-block digests of prompt embeddings, if any.
	PromptEmbeds [][]byte
}

// extraKey appends one key's encoding: a tag, the length of its bytes
// (u32 little-endian), the bytes, and for an item its offset relative to
// the block (i64 little-endian).
func extraKey(enc []byte, tag byte, b []byte, offset *int64) []byte {
	enc = append(enc, tag)
	enc = binary.LittleEndian.AppendUint32(enc, uint32(len(b)))
	enc = append(enc, b...)
	if offset != nil {
		enc = binary.LittleEndian.AppendUint64(enc, uint64(*offset))
	}
	return enc
}

// BlockSeeds is each block's identity seed, as the server folds vLLM's
// extra keys: the items overlapping the block (walked by offset with one
// cursor, as vLLM walks them), then the salt on the first block, then the
// block's prompt-embeds digest, encoded and hashed; 0 for a block without.
func (id Identity) BlockSeeds(blocks, blockTokens int) ([]uint64, error) {
	items := append([]MmItem(nil), id.MmItems...)
	sort.SliceStable(items, func(a, b int) bool { return items[a].Offset < items[b].Offset })
	if id.PromptEmbeds != nil && len(id.PromptEmbeds) < blocks {
		blocks = len(id.PromptEmbeds)
	}
	seeds := make([]uint64, 0, blocks)
	next := 0
	for b := 0; b < blocks; b++ {
		start, end := uint64(b*blockTokens), uint64((b+1)*blockTokens)
		var enc []byte
		last := len(items) - 1
		pastAll := last < 0 || uint64(items[last].Offset)+uint64(items[last].Length) <= start
		for !pastAll && next < len(items) {
			it := items[next]
			off, stop := uint64(it.Offset), uint64(it.Offset)+uint64(it.Length)
			if end <= off {
				break
			}
			if start >= stop {
				next++
				continue
			}
			rel := int64(off) - int64(start)
			enc = extraKey(enc, 1, []byte(it.Identifier), &rel)
			if end >= stop {
				next++
			} else {
				break
			}
		}
		if b == 0 && id.CacheSalt != "" {
			enc = extraKey(enc, 2, []byte(id.CacheSalt), nil)
		}
		if id.PromptEmbeds != nil {
			enc = extraKey(enc, 3, id.PromptEmbeds[b], nil)
		}
		if enc == nil {
			seeds = append(seeds, 0)
			continue
		}
		seed, err := xxh3(enc)
		if err != nil {
			return nil, fmt.Errorf("block %d's identity: %v", b, err)
		}
		seeds = append(seeds, seed)
	}
	return seeds, nil
}

// TokenKeyWith is the key of a token-id prompt with an identity: each
// block's hash seeded with its identity seed (TokenKey for a plain one).
func TokenKeyWith(tokens []uint32, blockTokens int, id Identity) ([]uint64, error) {
	if blockTokens <= 0 {
		return nil, fmt.Errorf("block size %d", blockTokens)
	}
	seeds, err := id.BlockSeeds(len(tokens)/blockTokens, blockTokens)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 4*blockTokens)
	key := make([]uint64, 0, len(seeds))
	for b, seed := range seeds {
		for i, t := range tokens[b*blockTokens : (b+1)*blockTokens] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		h, err := xxh3Seeded(buf, seed)
		if err != nil {
			return nil, err
		}
		key = append(key, h)
	}
	return key, nil
}

// parseMmItems reads "IDENTIFIER:OFFSET:LENGTH,..." (an identifier may
// hold colons).
func parseMmItems(s string) ([]MmItem, error) {
	var items []MmItem
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		i := strings.LastIndex(f, ":")
		j := -1
		if i > 0 {
			j = strings.LastIndex(f[:i], ":")
		}
		if j <= 0 {
			return nil, fmt.Errorf("a multimodal item is IDENTIFIER:OFFSET:LENGTH, not %q", f)
		}
		off, err1 := strconv.ParseUint(f[j+1:i], 10, 32)
		n, err2 := strconv.ParseUint(f[i+1:], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("a multimodal item is IDENTIFIER:OFFSET:LENGTH, not %q", f)
		}
		items = append(items, MmItem{f[:j], uint32(off), uint32(n)})
	}
	return items, nil
}
