package headers

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHeaderValues(t *testing.T) {
	for name, tc := range map[string]struct {
		h    http.Header
		want []string
		has  bool
	}{
		"canonical":             {http.Header{"Authorization": {"a"}}, []string{"a"}, true},
		"lower case":            {http.Header{"authorization": {"a"}}, []string{"a"}, true},
		"mixed case":            {http.Header{"AUTHORIZATION": {"a", "b"}}, []string{"a", "b"}, true},
		"several spellings":     {http.Header{"authorization": {"c"}, "Authorization": {"a"}, "AuthoriZation": {"b"}}, []string{"a", "b", "c"}, true},
		"absent":                {http.Header{"Accept": {"x"}}, nil, false},
		"present without value": {http.Header{"authorization": {}}, nil, false},
		"a longer name":         {http.Header{"Authorizations": {"x"}}, nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, Values(tc.h, "Authorization"))
			assert.Equal(t, tc.has, Has(tc.h, "Authorization"))
		})
	}
	h := http.Header{"Authorization": {"a"}}
	before := append([]string(nil), h["Authorization"]...)
	h["authorization"] = []string{"b"}
	_ = append(Values(h, "Authorization"), "c")
	assert.Equal(t, before, h["Authorization"], "the header's own slice is not appended to")
}

// The common case, canonical names only, costs no allocation.
func TestHeaderValuesCanonicalDoesNotAllocate(t *testing.T) {
	h := http.Header{"Authorization": {"a"}, "Accept": {"x"}, "User-Agent": {"y"}}
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		Values(h, "Authorization")
		Values(h, "Cookie")
		Has(h, "Authorization")
		Has(h, "Cookie")
	}))
}
