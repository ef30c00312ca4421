package overload

import (
	"math"
	"slices"
	"time"
)

// A gradient is the latency limit: how many attempts may be in flight, from
// how the recent time to headers compares with its long-run baseline. It is
// the algorithm of failsafe-go's adaptivelimiter (Gradient, after Netflix's
// concurrency-limits), rewritten here because of what that one costs on the
// success path: a permit allocated per attempt and, at the rates one replica
// sees, a t-digest insertion per success, about 1,540 of the 6,450
// instructions the standard handler added to a call, where issue 31 allows
// about 4,950 in all. This one costs about 480 (bench/README.md, "Issue
// 31's success-path targets"): nothing per attempt but the limiter's own
// count of attempts in flight, and per sample (one in a stride of the
// successes, every timeout) a clock read and a store.
//
// Samples are gathered in windows of at least gradientMinWindow and
// gradientMinSamples. A window's 90th percentile, through a median of the
// last five and a moving average of five, is the recent latency, and a
// moving average of ten windows of it the baseline. Their ratio is a
// queue estimate, limit × (1 − baseline/recent): over beta (6, once the
// limit reaches 100: 12), the limit falls by one step; under alpha (3; 6)
// it grows by one, unless the limit was full and, across the last 50
// windows, throughput does not grow with concurrency while latency does.
// A limit that held attempts back in a window whose own 90th percentile
// stayed within slowStartRise of the baseline doubles instead (slow
// start, which failsafe-go's lacks). It never exceeds gradientHeadroom ×
// the most attempts seen in flight in the window, nor leaves [min, max].
type gradient struct {
	limit, min, max float64

	// the window being gathered
	rtts   []float64 // sampled times to headers in ns, the last gradientKeep
	n      int       // samples in the window
	maxK   int       // most attempts in flight when a sample was sent
	minRTT float64
	until  time.Time // the earliest end of the window
	// doubled says that the last window ended in slow start: the limit
	// doubled, and the next window is two round trips long
	doubled bool

	medians    [gradientSmoothing]float64 // the last windows' 90th percentiles
	nMedians   int
	recent     average // of the medians
	baseline   average // of recent
	rttCorr    correlation
	thruputCor correlation
}

const (
	gradientMinWindow  = time.Second
	gradientMaxWindow  = 30 * time.Second
	gradientMinSamples = 50
	gradientKeep       = 512 // samples kept per window; later ones replace the oldest
	gradientQuantile   = 0.9
	gradientSmoothing  = 5  // windows in the median and in recent's average
	gradientBaseline   = 10 // windows in the baseline's average
	gradientWarmup     = 10 // values an average or a correlation takes as a plain mean first
	gradientCorrWindow = 50 // windows in a correlation
	gradientHeadroom   = 5  // the limit is at most this many times the attempts in flight

	// slowStartRise is how far over the baseline a window's 90th
	// percentile may be for a limit that held attempts back to double.
	slowStartRise = 1.1
)

func newGradient(min, max, initial int, now time.Time) *gradient {
	return &gradient{
		limit: float64(initial), min: float64(max1(min)), max: float64(max),
		rtts:       make([]float64, 0, gradientKeep),
		until:      now,
		recent:     newAverage(gradientSmoothing),
		baseline:   newAverage(gradientBaseline),
		rttCorr:    newCorrelation(gradientCorrWindow),
		thruputCor: newCorrelation(gradientCorrWindow),
	}
}

func max1(n int) int { return max(n, 1) }

// sample adds rtt, the time to headers (or to its timeout) of an attempt
// sent with k attempts in flight, its own included, at now; full says that
// the limit was reached when it ended. It reports whether the limit moved.
func (g *gradient) sample(now time.Time, rtt time.Duration, k int, full bool) bool {
	x := float64(rtt)
	if g.n == 0 {
		g.minRTT, g.maxK = x, k
	} else {
		g.minRTT, g.maxK = min(g.minRTT, x), max(g.maxK, k)
	}
	if len(g.rtts) < cap(g.rtts) {
		g.rtts = append(g.rtts, x)
	} else {
		g.rtts[g.n%gradientKeep] = x
	}
	g.n++
	if now.Before(g.until) || g.n < gradientMinSamples {
		return false
	}
	q := quantile(g.rtts, gradientQuantile)
	old := g.limit
	g.update(g.recent.add(g.median(q)), q, g.maxK, full)
	window := min(max(time.Duration(2*g.minRTT), gradientMinWindow), gradientMaxWindow)
	if g.doubled {
		// In slow start the next window lasts two round trips, as TCP's
		// does, rather than a second: 100 callers held at a limit of 20
		// waited three windows of a second for the limit to reach them.
		window = time.Duration(2 * g.minRTT)
	}
	g.until = now.Add(window)
	g.rtts, g.n = g.rtts[:0], 0
	return int(old) != int(g.limit)
}

// median adds q to the last windows' and returns their median, or q until
// there are gradientSmoothing-1 of them.
func (g *gradient) median(q float64) float64 {
	g.medians[g.nMedians%gradientSmoothing] = q
	g.nMedians++
	if g.nMedians < gradientSmoothing {
		return q
	}
	s := g.medians
	slices.Sort(s[:])
	return s[gradientSmoothing/2]
}

// update moves the limit by recent, the smoothed latency of the window
// that ended, its own 90th percentile q, and k, the most attempts in
// flight in it.
func (g *gradient) update(recent, q float64, k int, full bool) {
	base := g.baseline.add(recent)
	queue := int(math.Ceil(g.limit * (1 - base/recent)))
	thruput := float64(k) / (recent / 1e9)
	thruputCorr, _, thruputCV := g.thruputCor.add(float64(k), thruput)
	rttCorr, _, _ := g.rttCorr.add(float64(k), recent)

	step := log10Step(int(g.limit))
	alpha, beta := 3*step, 6*step
	next := g.limit
	g.doubled = false
	switch {
	case queue > beta,
		full && thruputCorr < 0,
		full && thruputCorr < 0.3 && rttCorr > 0.5,
		full && thruputCV < 0.2 && rttCorr > 0.5:
		next -= float64(step)
	case queue < alpha:
		next += float64(step)
		if k >= int(g.limit) && q <= base*slowStartRise {
			// The limit held attempts back while the latency stayed at
			// its baseline, in this window too (q, which the median and
			// the average have not smoothed yet): the limit, not the
			// upstream, is what bounds them. It doubles, as TCP's window
			// does in slow start.
			next = max(next, 2*g.limit)
			g.doubled = true
		}
	}
	if ceiling := float64(k) * gradientHeadroom; next > ceiling {
		switch {
		case g.limit > ceiling:
			next = g.limit - float64(step) // down a step at a time: in flight moves a lot
		default:
			next = ceiling
		}
	}
	g.limit = min(max(next, g.min), g.max)
}

// log10Step is the limit's step: the number of its decimal digits less one,
// at least 1.
func log10Step(limit int) int {
	if limit < 100 {
		return 1
	}
	return int(math.Log10(float64(limit)))
}

// quantile returns the q quantile of xs, reordering them.
func quantile(xs []float64, q float64) float64 {
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(i, 0)]
}

// An average is a moving average over about age values (a smoothing factor
// of 2/(age+1)), and their plain mean for the first gradientWarmup.
type average struct {
	n      int
	sum, v float64
	factor float64
}

func newAverage(age int) average { return average{factor: 2 / float64(age+1)} }

func (a *average) add(x float64) float64 {
	if a.n < gradientWarmup {
		a.n++
		a.sum += x
		a.v = a.sum / float64(a.n)
	} else {
		a.v += (x - a.v) * a.factor
	}
	return a.v
}

// A correlation is Pearson's coefficient between x and y over their last
// values, with each one's coefficient of variation. It is 0 for the first
// gradientWarmup pairs, and where either varies by less than 1 %.
type correlation struct {
	x, y  movingSum
	sumXY float64
}

func newCorrelation(size int) correlation {
	return correlation{x: movingSum{v: make([]float64, size)}, y: movingSum{v: make([]float64, size)}}
}

func (c *correlation) add(x, y float64) (corr, cvX, cvY float64) {
	if math.IsInf(x, 0) || math.IsInf(y, 0) {
		return 0, 0, 0
	}
	oldX, full := c.x.add(x)
	oldY, _ := c.y.add(y)
	if full {
		c.sumXY -= oldX * oldY
	}
	c.sumXY += x * y
	cvX, meanX, varX := c.x.cv()
	cvY, meanY, varY := c.y.cv()
	if math.IsNaN(cvX) || math.IsNaN(cvY) || c.x.n < gradientWarmup {
		return 0, 0, 0
	}
	if cvX < 0.01 || cvY < 0.01 {
		return 0, cvX, cvY
	}
	cov := c.sumXY/float64(c.x.n) - meanX*meanY
	return cov / (math.Sqrt(varX) * math.Sqrt(varY)), cvX, cvY
}

// A movingSum holds the last len(v) values, their sum and the sum of their
// squares.
type movingSum struct {
	v       []float64
	n, i    int
	sum, sq float64
}

func (m *movingSum) add(x float64) (old float64, full bool) {
	if m.n == len(m.v) {
		full, old = true, m.v[m.i]
		m.sum -= old
		m.sq -= old * old
	} else {
		m.n++
	}
	m.v[m.i] = x
	m.sum += x
	m.sq += x * x
	m.i = (m.i + 1) % len(m.v)
	return old, full
}

// cv returns the coefficient of variation, the mean and the variance of
// the values, or NaNs for fewer than two, a zero mean or a negative
// variance (rounding).
func (m *movingSum) cv() (cv, mean, variance float64) {
	if m.n < 2 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	mean = m.sum / float64(m.n)
	variance = m.sq/float64(m.n) - mean*mean
	if variance < 0 || mean == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	return math.Sqrt(variance) / mean, mean, variance
}
