package resilience

import (
	"encoding/json"
	"fmt"

	"github.com/resilienthttp/resilience/internal/contract"
	"github.com/resilienthttp/resilience/server"
)

// PropagationOptions sends each attempt's budget and number, and honours a
// server's pushback; package server is the other half. See
// docs/deadline-contract.md.
type PropagationOptions struct {
	Enabled bool           // off by default: requests leave with the caller's headers
	Headers server.Headers // the names; default server.DefaultHeaders()
}

var propagationFields = fieldSet[PropagationOptions]{
	"enabled": boolField(func(o *PropagationOptions) *bool { return &o.Enabled }),
	"headers": headerNamesField,
}

// headerNamesField reads "neutral", "envoy", or an object naming each
// field: {"budget": ..., "attempt": ..., "pushback": ...}.
func headerNamesField(o *PropagationOptions, raw json.RawMessage, path string) error {
	var preset string
	if json.Unmarshal(raw, &preset) == nil {
		switch preset {
		case "neutral":
			o.Headers = server.DefaultHeaders()
		case "envoy":
			o.Headers = server.EnvoyHeaders()
		default:
			return configErr(path, "want \"neutral\", \"envoy\" or an object of budget, attempt and pushback names, got %s", brief(raw))
		}
		return nil
	}
	var names map[string]string
	if err := json.Unmarshal(raw, &names); err != nil {
		return configErr(path, "want \"neutral\", \"envoy\" or an object of budget, attempt and pushback names, got %s", brief(raw))
	}
	for _, k := range sortedKeys(names) {
		switch k {
		case "budget":
			o.Headers.Budget = names[k]
		case "attempt":
			o.Headers.Attempt = names[k]
		case "pushback":
			o.Headers.Pushback = names[k]
		default:
			return configErr(path+"."+k, "unknown field; want budget, attempt or pushback")
		}
	}
	return nil
}

// resolvePropagation fills in the header names and checks them.
func resolvePropagation(p *PropagationOptions, bad badOption) error {
	names := contract.Names(p.Headers)
	if field, value, reason := names.Resolve(); field != "" {
		return bad("Propagation.Headers."+field, fmt.Sprintf("%q", value), reason)
	}
	p.Headers = server.Headers(names)
	return nil
}
