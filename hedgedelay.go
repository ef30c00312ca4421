package resilience

import (
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
