package main

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// XXH3-64 for inputs of up to 240 bytes, with a seed: the block hash of the
// prefix-index key rule (docs/protocol.md), seed 0 for a plain block and
// the block's identity seed otherwise. Token blocks of up to 60 ids (240
// bytes) and the default text blocks (64 bytes) are in range; longer inputs
// take XXH3's long path, which this example does not carry.

const maxHashLen = 240

var secret = [192]byte{
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}

const (
	prime32_1 = 0x9E3779B1
	prime64_1 = 0x9E3779B185EBCA87
	prime64_2 = 0xC2B2AE3D27D4EB4F
	prime64_3 = 0x165667B19E3779F9
	primeMx1  = 0x165667919E3779F9
	primeMx2  = 0x9FB21C651E98DF25
)

func r32(b []byte, i int) uint64 { return uint64(binary.LittleEndian.Uint32(b[i:])) }
func r64(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }

func fold64(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func avalanche(h uint64) uint64 {
	h ^= h >> 37
	h *= primeMx1
	return h ^ h>>32
}

func xxh64Avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime64_2
	h ^= h >> 29
	h *= prime64_3
	return h ^ h>>32
}

func rrmxmx(h uint64, n uint64) uint64 {
	h ^= bits.RotateLeft64(h, 49) ^ bits.RotateLeft64(h, 24)
	h *= primeMx2
	h ^= (h >> 35) + n
	h *= primeMx2
	return h ^ h>>28
}

func mix16(in []byte, i int, s int, seed uint64) uint64 {
	return fold64(r64(in, i)^(r64(secret[:], s)+seed), r64(in, i+8)^(r64(secret[:], s+8)-seed))
}

// xxh3 is XXH3-64 (seed 0) of in, for len(in) <= 240.
func xxh3(in []byte) (uint64, error) { return xxh3Seeded(in, 0) }

// xxh3Seeded is XXH3-64 of in with seed, for len(in) <= 240.
func xxh3Seeded(in []byte, seed uint64) (uint64, error) {
	n := len(in)
	s := secret[:]
	switch {
	case n > maxHashLen:
		return 0, fmt.Errorf("%d bytes to hash: this example hashes up to %d bytes", n, maxHashLen)
	case n == 0:
		return xxh64Avalanche(seed ^ r64(s, 56) ^ r64(s, 64)), nil
	case n <= 3:
		combined := uint64(in[0])<<16 | uint64(in[n>>1])<<24 | uint64(in[n-1]) | uint64(n)<<8
		return xxh64Avalanche(combined ^ ((r32(s, 0) ^ r32(s, 4)) + seed)), nil
	case n <= 8:
		seed ^= uint64(bits.ReverseBytes32(uint32(seed))) << 32
		input := r32(in, n-4) + r32(in, 0)<<32
		return rrmxmx(input^((r64(s, 8)^r64(s, 16))-seed), uint64(n)), nil
	case n <= 16:
		lo := r64(in, 0) ^ ((r64(s, 24) ^ r64(s, 32)) + seed)
		hi := r64(in, n-8) ^ ((r64(s, 40) ^ r64(s, 48)) - seed)
		acc := uint64(n) + bits.ReverseBytes64(lo) + hi + fold64(lo, hi)
		return avalanche(acc), nil
	case n <= 128:
		acc := uint64(n) * prime64_1
		if n > 32 {
			if n > 64 {
				if n > 96 {
					acc += mix16(in, 48, 96, seed) + mix16(in, n-64, 112, seed)
				}
				acc += mix16(in, 32, 64, seed) + mix16(in, n-48, 80, seed)
			}
			acc += mix16(in, 16, 32, seed) + mix16(in, n-32, 48, seed)
		}
		acc += mix16(in, 0, 0, seed) + mix16(in, n-16, 16, seed)
		return avalanche(acc), nil
	default:
		acc := uint64(n) * prime64_1
		for i := 0; i < 8; i++ {
			acc += mix16(in, 16*i, 16*i, seed)
		}
		acc = avalanche(acc)
		for i := 8; i < n/16; i++ {
			acc += mix16(in, 16*i, 16*(i-8)+3, seed)
		}
		acc += mix16(in, n-16, 136-17, seed)
		return avalanche(acc), nil
	}
}
