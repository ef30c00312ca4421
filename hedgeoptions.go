package resilience

import (
	"encoding/json"
	"math"
	"time"
)

// Defaults of HedgingOptions: what a zero field means.
const (
	defaultMaxHedges       = 1
	defaultHedgingDelay    = 2 * time.Second
	defaultHedgingMinDelay = time.Millisecond
	defaultMaxExtraLoad    = 0.05
)

// HedgingOptions configures hedging, which replaces the retry layer: while
// no attempt has an acceptable outcome, another follows after Delay (at once
// after a failure, unless its server asked for a wait with Retry-After, as
// Retry's options read it), up to MaxHedges more; the first acceptable
// outcome wins. Only requests the method rule allows are hedged. Each hedge
// needs a closed circuit, and one after a failure a budget token. See
// docs/hedging.md.
type HedgingOptions struct {
	Enabled   bool          // off by default
	MaxHedges int           // attempts besides the first, at most 10; default 1
	Delay     time.Duration // how long before the next attempt; default 2s

	// DelayPercentile, in (0, 1), hedges the attempts slower than this
	// percentile of the last 5-10s' latencies, once 100 are seen. Default 0.
	DelayPercentile float64
	MinDelay        time.Duration // shortest adaptive delay; default 1ms
	MaxDelay        time.Duration // longest adaptive delay; default Delay

	// MaxExtraLoad caps the hedges sent while an attempt runs at this share
	// of the last 10s' calls, plus one: in (0, 10], or NoExtraLoadCap for no
	// cap. Default 0.05.
	MaxExtraLoad float64
}

// NoExtraLoadCap, as Hedging.MaxExtraLoad, puts no cap on hedges.
const NoExtraLoadCap = -1.0

// resolveExtraLoad validates and fills in Hedging.MaxExtraLoad.
func resolveExtraLoad(hg *HedgingOptions, bad badOption) error {
	x := hg.MaxExtraLoad
	switch {
	case x == NoExtraLoadCap:
		return nil
	case math.IsNaN(x) || x < 0 || x > 10:
		return bad("Hedging.MaxExtraLoad", x, "must be in (0, 10] (a share of calls, such as 0.05), or NoExtraLoadCap (-1) for no cap")
	case x == 0:
		hg.MaxExtraLoad = defaultMaxExtraLoad
	}
	return nil
}

// resolveHedgeDelay validates and fills in the adaptive delay's options.
// hg.Delay is already filled in.
func resolveHedgeDelay(hg *HedgingOptions, bad badOption) error {
	switch {
	case math.IsNaN(hg.DelayPercentile) || hg.DelayPercentile < 0 || hg.DelayPercentile >= 1:
		return bad("Hedging.DelayPercentile", hg.DelayPercentile, "must be in (0, 1), such as 0.95; 0 uses the fixed Delay")
	case hg.MinDelay < 0:
		return bad("Hedging.MinDelay", hg.MinDelay, "must not be negative")
	case hg.MaxDelay < 0:
		return bad("Hedging.MaxDelay", hg.MaxDelay, "must not be negative")
	}
	if hg.MinDelay == 0 {
		hg.MinDelay = defaultHedgingMinDelay
		if hg.MaxDelay > 0 {
			hg.MinDelay = min(hg.MinDelay, hg.MaxDelay) // the default yields to a shorter MaxDelay
		}
	}
	if hg.MaxDelay == 0 {
		hg.MaxDelay = max(hg.Delay, hg.MinDelay)
	}
	if hg.MaxDelay < hg.MinDelay {
		return bad("Hedging.MaxDelay", hg.MaxDelay, "must not be below Hedging.MinDelay ("+hg.MinDelay.String()+")")
	}
	return nil
}

var hedgingFields = fieldSet[HedgingOptions]{
	"enabled": boolField(func(o *HedgingOptions) *bool { return &o.Enabled }),
	"maxHedges": intField(func(o *HedgingOptions) *int { return &o.MaxHedges },
		keepZero),
	"delay": durationField(func(o *HedgingOptions) *time.Duration { return &o.Delay },
		keepZero),
	"delayPercentile": floatField(func(o *HedgingOptions) *float64 { return &o.DelayPercentile }, keepZero),
	"minDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MinDelay },
		keepZero),
	"maxDelay": durationField(func(o *HedgingOptions) *time.Duration { return &o.MaxDelay },
		keepZero),
	"maxExtraLoad": maxExtraLoadField,
	"routing":      movedField[HedgingOptions]("routing"),
	"endpoints":    movedField[HedgingOptions]("endpoints"),
}

// movedField refuses a field written where it was before it moved to the
// top level of an upstream, and says where it is now.
func movedField[T any](name string) func(*T, json.RawMessage, string) error {
	return func(_ *T, _ json.RawMessage, path string) error {
		return configErr(path, "moved: write %q beside \"hedging\", for retries and hedges alike", name)
	}
}

// maxExtraLoadField reads hedging.maxExtraLoad; a written 0 meant no cap.
var maxExtraLoadField = floatField(func(o *HedgingOptions) *float64 { return &o.MaxExtraLoad },
	refuseZero("no cap", "-1 (NoExtraLoadCap) for no cap"))

// resolveHedging fills in hedging's defaults and validates it.
func resolveHedging(hg *HedgingOptions, bad badOption) error {
	switch {
	case hg.MaxHedges < 0 || hg.MaxHedges > 10:
		return bad("Hedging.MaxHedges", hg.MaxHedges, "must be between 1 and 10")
	case hg.Delay < 0:
		return bad("Hedging.Delay", hg.Delay, "must not be negative")
	}
	if hg.MaxHedges == 0 {
		hg.MaxHedges = defaultMaxHedges
	}
	if hg.Delay == 0 {
		hg.Delay = defaultHedgingDelay
	}
	if err := resolveHedgeDelay(hg, bad); err != nil {
		return err
	}
	if err := resolveExtraLoad(hg, bad); err != nil {
		return err
	}
	return nil
}
