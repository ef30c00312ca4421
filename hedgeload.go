package resilience

import "math"

// NoExtraLoadCap, as Hedging.MaxExtraLoad, puts no cap on hedges.
const NoExtraLoadCap = -1.0

// resolveExtraLoad validates and fills in Hedging.MaxExtraLoad.
func resolveExtraLoad(hg *HedgingOptions, bad func(string, any, string) error) error {
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
