package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"net/http"
	"slices"
)

// digest is the SHA-256 of the canonical request: its method, path, query
// (parsed, keys sorted, each key's values in their order), the headers
// named (sorted by canonical name, values in order) and the body. Every
// part is length-prefixed, so no two different requests share an encoding.
func digest(r *http.Request, headers []string, body []byte) Digest {
	h := sha256.New()
	field(h, r.Method)
	field(h, r.URL.Path)
	field(h, r.URL.Query().Encode())
	names := make([]string, len(headers))
	for i, n := range headers {
		names[i] = http.CanonicalHeaderKey(n)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		field(h, n)
		vs, _ := headerValues(r.Header, n)
		length(h, len(vs))
		for _, v := range vs {
			field(h, v)
		}
	}
	length(h, len(body))
	h.Write(body)
	var d Digest
	h.Sum(d[:0])
	return d
}

func field(h hash.Hash, s string) {
	length(h, len(s))
	h.Write([]byte(s))
}

func length(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.Write(b[:])
}
