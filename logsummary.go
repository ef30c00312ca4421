package resilience

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Logger output is summarised for the events every call may emit, so that
// an outage is a handful of records a team can keep, not one per call: each
// kind counted over logSummaryInterval is one record, "resilience: <kind>"
// with count and interval, at the kind's level. A change of state (the
// circuit, the overload limiter, the shared rate, the retry budget) is one
// record per change already, and is logged as it happens. A kind listed in
// Options.LogLevels is logged one record per event, as are EventAttempt and
// EventCall: they are Debug, off unless someone is debugging, and then the
// point is each attempt's detail; their counts are what metrics are for.
//
// A summary is flushed by a timer armed by the first event counted after
// the last flush (time.AfterFunc: no goroutine runs until it fires, and the
// one it starts ends with the flush). A flush left to the next event would
// lose the count of an incident's last interval, the one that says when it
// ended, until traffic of that kind came back.

// logSummaryInterval is how long a summarised kind is counted before its
// count is logged.
const logSummaryInterval = 10 * time.Second

// summarised reports whether Logger gets k as a count per interval rather
// than one record per event, when Options.LogLevels does not list it.
func (k EventKind) summarised() bool {
	switch k {
	case EventRetry, EventAttemptTimeout, EventTotalTimeout, EventCircuitRejected, EventRateLimited,
		EventBudgetExceeded, EventOverloadShed, EventHedge, EventHedgeCapped, EventFallback, EventPushback, EventAttemptHeld:
		return true
	}
	return false
}

// A logSummary counts the summarised events of one config's Logger. Each
// config (Update makes a new one) has its own, so that counts made under a
// Logger are logged to it.
type logSummary struct {
	logger *slog.Logger
	name   string
	every  time.Duration               // logSummaryInterval; tests shorten it
	after  func(time.Duration, func()) // time.AfterFunc; tests replace it

	armed  atomic.Bool // a flush is due
	counts [len(eventKindNames)]atomic.Int64
}

func newLogSummary(logger *slog.Logger, name string) *logSummary {
	return &logSummary{logger: logger, name: name, every: logSummaryInterval,
		after: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
}

// count counts an event of kind k, and arms the flush if none is due. An
// event the logger would drop at k's level is not counted.
func (s *logSummary) count(k EventKind) {
	if !s.logger.Enabled(context.Background(), k.defaultLevel()) {
		return
	}
	s.counts[k].Add(1)
	if !s.armed.Load() && s.armed.CompareAndSwap(false, true) {
		s.after(s.every, s.flush)
	}
}

// flush logs one record per kind counted since the last flush. It disarms
// before it reads the counts, so that an event counted meanwhile is either
// in this flush or arms the next: none is lost, none counted twice.
func (s *logSummary) flush() {
	s.armed.Store(false)
	for i := range s.counts {
		n := s.counts[i].Swap(0)
		if n == 0 {
			continue
		}
		k := EventKind(i)
		s.logger.LogAttrs(context.Background(), k.defaultLevel(), "resilience: "+k.String(),
			slog.String("handler", s.name), slog.String("event", k.String()),
			slog.Int64("count", n), slog.Duration("interval", s.every))
	}
}
