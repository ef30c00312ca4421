package breaker

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// changes records what a Circuit notifies.
type changes struct {
	mu      sync.Mutex
	states  []State
	reasons []error
}

func (c *changes) notify(to State, reason error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states = append(c.states, to)
	c.reasons = append(c.reasons, reason)
}

func (c *changes) seen() []State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]State(nil), c.states...)
}

// opts opens at half of four attempts and stays open for brk.
func opts(brk time.Duration) Options {
	return Options{FailureRatio: 0.5, MinimumThroughput: 4, SamplingDuration: time.Minute, BreakDuration: brk}
}

// trip opens c with four failures described by what.
func trip(t *testing.T, c *Circuit, what ...string) {
	t.Helper()
	for i := 0; i < 4; i++ {
		_, err := c.Admit()
		require.NoError(t, err)
		c.RecordFailure(what[i%len(what)])
	}
	require.Equal(t, Open, c.State())
}

// waitHalfOpen waits for c's break to end: the next Admit is the probe.
func waitHalfOpen(t *testing.T, c *Circuit) {
	t.Helper()
	require.Eventually(t, func() bool { return c.State() == HalfOpen }, 2*time.Second, time.Millisecond)
}

func TestOpensWithTheFailuresMostFrequentFirst(t *testing.T) {
	ch := &changes{}
	c := New(opts(time.Hour), ch.notify)
	trip(t, c, "503 Service Unavailable", "503 Service Unavailable", "502 Bad Gateway", "503 Service Unavailable")

	assert.Equal(t, []State{Open}, ch.seen())
	want := "4 of 4 attempts failed; last failures: 503 Service Unavailable (x3), 502 Bad Gateway (x1)"
	require.Error(t, ch.reasons[0])
	assert.Equal(t, want, ch.reasons[0].Error())
	_, err := c.Admit()
	require.Error(t, err, "an open circuit refuses")
	assert.Equal(t, want, err.Error(), "and says why")
	assert.Equal(t, want, c.Reason().Error())
	assert.Greater(t, c.RemainingBreak(), 59*time.Minute)
}

func TestReasonIsBounded(t *testing.T) {
	c := New(opts(time.Hour), func(State, error) {})
	long := make([]string, 4)
	for i := range long {
		long[i] = strings.Repeat(string(rune('a'+i)), 1000) // four distinct texts the caller did not bound
	}
	trip(t, c, long...)
	assert.LessOrEqual(t, len(c.Reason().Error()), MaxReason)
}

// A successful probe closes the circuit; a failed one opens it again, with
// the probe's failure as the reason. Each change is notified once.
func TestProbeDecides(t *testing.T) {
	ch := &changes{}
	c := New(opts(5*time.Millisecond), ch.notify)
	trip(t, c, "503")
	waitHalfOpen(t, c)

	n, err := c.Admit()
	require.NoError(t, err)
	require.NotZero(t, n, "the first attempt of a half-open circuit is its probe")
	_, err = c.Admit()
	var pe *probingError
	require.ErrorAs(t, err, &pe, "a second attempt waits for the probe")
	c.RecordFailure("timeout")
	assert.Equal(t, Open, c.State())
	assert.Equal(t, "the half-open probe failed; last failures: 503 (x4), timeout (x1)", c.Reason().Error())

	waitHalfOpen(t, c)
	n, err = c.Admit()
	require.NoError(t, err)
	require.NotZero(t, n)
	c.RecordSuccess()
	assert.Equal(t, Closed, c.State())
	assert.Equal(t, []State{Open, HalfOpen, Open, HalfOpen, Closed}, ch.seen())

	n, err = c.Admit()
	require.NoError(t, err)
	assert.Zero(t, n, "a closed circuit's attempts are not probes")
}

// The breaker's listeners run after it has released its lock, so a caller
// can take the half-open permit before the listener has recorded the
// state. The breaker, not the listener, says whether a permit is the
// probe; otherwise the probe's caller giving up would record nothing and
// the circuit would stay half-open for ever. The listener's lag is pinned
// here by putting back the state it had not yet recorded.
func TestProbeTakenBeforeListenerRunsIsTheProbe(t *testing.T) {
	c := New(opts(5*time.Millisecond), func(State, error) {})
	trip(t, c, "503")
	waitHalfOpen(t, c)
	c.Breaker().HalfOpen()    // the transition a caller's TryAcquirePermit makes...
	c.seen.Store(int32(Open)) // ...before its listener records it

	n, err := c.Admit()
	require.NoError(t, err)
	require.NotZero(t, n, "the permit taken while the breaker is half-open is the probe")
	c.AbandonProbe(n, "half-open probe abandoned: context deadline exceeded")
	assert.Equal(t, Open, c.State(), "an abandoned probe counts as a failure")

	waitHalfOpen(t, c)
	n, err = c.Admit()
	require.NoError(t, err)
	require.NotZero(t, n)
	c.RecordSuccess()
	assert.Equal(t, Closed, c.State(), "the circuit was not wedged")
}

// A probe whose outcome says nothing of the upstream gives its permit back:
// the next attempt is the probe at once. One that has run a whole break
// gets a successor.
func TestProbeReleasedAndHungProbeSuperseded(t *testing.T) {
	c := New(opts(20*time.Millisecond), func(State, error) {})
	trip(t, c, "503")
	waitHalfOpen(t, c)
	n, err := c.Admit()
	require.NoError(t, err)
	c.ReleaseProbe(n)
	m, err := c.Admit()
	require.NoError(t, err)
	assert.Greater(t, m, n, "the released permit went to the next attempt")

	_, err = c.Admit()
	require.Error(t, err, "the probe in flight holds the permit")
	require.Eventually(t, func() bool {
		k, err := c.Admit()
		return err == nil && k > m
	}, 2*time.Second, time.Millisecond, "a hung probe gets a successor after BreakDuration")
	c.AbandonProbe(m, "superseded") // counts for nothing: its permit is gone
	assert.Equal(t, HalfOpen, c.State())
}

func TestProbingErrorText(t *testing.T) {
	e := &probingError{running: 1200 * time.Millisecond, next: 3800 * time.Millisecond, reason: errors.New("12 of 100 attempts failed")}
	assert.Equal(t, "half-open, its probe in flight for 1.2s (another in 3.8s); 12 of 100 attempts failed", e.Error())
	assert.True(t, strings.HasPrefix((&probingError{}).Error(), "half-open, its probe in flight"))
	assert.Equal(t, e.reason, errors.Unwrap(e))
}

// Reconfigure keeps an open circuit open for the rest of its break (not a
// new one), silently; with the same options it keeps the breaker itself.
func TestReconfigureCarriesTheState(t *testing.T) {
	ch := &changes{}
	c := New(opts(time.Hour), ch.notify)
	b := c.Breaker()
	c.Reconfigure(opts(time.Hour))
	assert.Same(t, b, c.Breaker(), "the same options keep the breaker")

	trip(t, c, "503")
	left := c.RemainingBreak()
	o := opts(2 * time.Hour)
	o.MinimumThroughput = 5
	c.Reconfigure(o)
	assert.NotSame(t, b, c.Breaker())
	assert.Equal(t, o, c.Options())
	assert.Equal(t, Open, c.State())
	assert.LessOrEqual(t, c.RemainingBreak(), left, "the break that was left, not a new one")
	assert.Equal(t, []State{Open}, ch.seen(), "carrying the state is not a change")

	o.Disabled = true
	c.Reconfigure(o)
	assert.False(t, c.Enabled())
	assert.True(t, c.Closed())
	assert.Equal(t, Closed, c.State())
	assert.Equal(t, []State{Open, Closed}, ch.seen(), "disabling the breaker closes the circuit")
	n, err := c.Admit()
	assert.NoError(t, err)
	assert.Zero(t, n)
}

// A retired breaker's listeners are silent: a transition of the old one
// after the replacement is not the circuit's.
func TestRetiredBreakerIsSilent(t *testing.T) {
	ch := &changes{}
	c := New(opts(time.Hour), ch.notify)
	old := c.Breaker()
	o := opts(time.Hour)
	o.FailureRatio = 0.75
	c.Reconfigure(o)
	old.Open()
	assert.Empty(t, ch.seen())
	assert.Equal(t, Closed, c.State())
}

func TestClose(t *testing.T) {
	ch := &changes{}
	c := New(opts(time.Hour), ch.notify)
	assert.False(t, c.Close(), "a closed circuit is left alone")
	trip(t, c, "503")
	assert.True(t, c.Close())
	assert.Equal(t, Closed, c.State())
	assert.Equal(t, []State{Open, Closed}, ch.seen())

	trip(t, c, "500")
	assert.Equal(t, "4 of 4 attempts failed; last failures: 500 (x4)", c.Reason().Error(),
		"a closed circuit explains afresh")
}
