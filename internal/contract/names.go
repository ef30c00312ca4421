package contract

import (
	"net/http"
	"strconv"

	"github.com/resilienthttp/resilience/internal/headers"
)

// Names are the contract's three field names, as each half is configured
// with them.
type Names struct{ Budget, Attempt, Pushback string }

// Resolve gives each empty name its neutral default, checks that each is a
// field name, and puts each in canonical form, as net/http keys a Header.
// A bad name is reported by the field that holds it ("Budget", "Attempt"
// or "Pushback"), as written, and why; field is empty when every name is
// good. A name written for one field that another's default holds is the
// written field's fault: a default has no other name to yield to.
func (n *Names) Resolve() (field, value, reason string) {
	given := *n
	for _, f := range []struct {
		name string
		v    *string
		def  string
	}{
		{"Budget", &n.Budget, BudgetHeader},
		{"Attempt", &n.Attempt, AttemptHeader},
		{"Pushback", &n.Pushback, PushbackHeader},
	} {
		if *f.v == "" {
			*f.v = f.def
		}
		if !headers.ValidName(*f.v) {
			return f.name, *f.v, "not a header field name (an RFC 9110 token)"
		}
		*f.v = http.CanonicalHeaderKey(*f.v)
	}
	if n.Attempt == n.Budget {
		switch {
		case given.Attempt == "":
			return "Budget", given.Budget, "the default name of Attempt; give Attempt another"
		case given.Budget == "":
			return "Attempt", given.Attempt, "the default name of Budget; give Budget another"
		}
		return "Attempt", given.Attempt, "the same field as Budget (" + strconv.Quote(given.Budget) + ")"
	}
	return "", "", ""
}
