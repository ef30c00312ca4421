package resilience

import (
	"math"
	"time"
)

// hedgeDelay returns how long an attempt of a call runs before the next is
// sent: Hedging.Delay, or with DelayPercentile, that percentile of the
// recent attempts within [MinDelay, MaxDelay] (Delay until enough attempts
// have been seen).
func (c hedging) hedgeDelay() time.Duration {
	hg := &c.cfg.Hedging
	if hg.DelayPercentile == 0 {
		return hg.Delay
	}
	d, ok := c.h.latency.Percentile(hg.DelayPercentile)
	if !ok {
		return hg.Delay
	}
	return min(hg.MaxDelay, max(hg.MinDelay, d))
}

// resolveHedgeDelay validates and fills in the adaptive delay's options.
// hg.Delay is already filled in.
func resolveHedgeDelay(hg *HedgingOptions, bad func(string, any, string) error) error {
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
