package resilience

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Config is the Options of named upstreams, as LoadConfig reads them.
type Config struct {
	Upstreams map[string]Options
}

// LoadConfig reads a JSON configuration of at most 1 MiB: "upstreams" holds
// each upstream's Options by name, in lower camel case with durations such
// as "250ms", and "defaults" what each starts from. A zero is the default,
// but four that meant otherwise before are refused. Errors name the upstream
// and the field. See docs/configuration.md.
func LoadConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("resilience: config: %w", err)
	}
	if len(data) > maxConfigSize {
		return Config{}, configErr("", "the configuration is larger than 1 MiB (%d bytes), the most LoadConfig reads", maxConfigSize)
	}
	var top map[string]json.RawMessage
	if err := strictUnmarshal(data, &top); err != nil {
		return Config{}, configErr("", "%s", jsonProblem(err))
	}
	for key := range top {
		if key != "defaults" && key != "upstreams" {
			return Config{}, configErr(key, "unknown field (known: defaults, upstreams)")
		}
	}
	var upstreams map[string]json.RawMessage
	if raw, ok := top["upstreams"]; ok {
		if err := strictUnmarshal(raw, &upstreams); err != nil || upstreams == nil {
			return Config{}, configErr("upstreams", "want an object of named upstreams")
		}
	}
	if len(upstreams) == 0 {
		return Config{}, configErr("upstreams", "no upstream is configured")
	}
	cfg := Config{Upstreams: make(map[string]Options, len(upstreams))}
	for _, name := range sortedKeys(upstreams) {
		path := "upstreams." + name
		if name == "" {
			return Config{}, configErr(path, "an upstream needs a name")
		}
		var o Options // the defaults, then the upstream
		if raw, ok := top["defaults"]; ok {
			if err := optionFields.decode(&o, raw, "defaults"); err != nil {
				return Config{}, err
			}
		}
		if err := optionFields.decode(&o, upstreams[name], path); err != nil {
			return Config{}, err
		}
		o.Name = name
		if _, err := resolve(o); err != nil {
			var oe *optionError
			if errors.As(err, &oe) {
				reason := jsonReason(oe.reason)
				return Config{}, configErr(fmt.Sprintf("%s.%s (%v)", path, jsonPath(oe.field), oe.value), "%s", reason)
			}
			return Config{}, configErr(path, "%v", err)
		}
		cfg.Upstreams[name] = o
	}
	return cfg, nil
}

// maxConfigSize is the most LoadConfig reads: a configuration of named
// upstreams is a few KiB, and a larger input is a mistake, not a file.
const maxConfigSize = 1 << 20

// Setters for one field of a given type.
