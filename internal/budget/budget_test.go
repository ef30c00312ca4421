package budget

import (
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allow reports whether a retry may be made now.
func (b *Budget) allow() bool { return b.Refuses() == nil }

// claim takes an unclaimed token, and reports whether there was one.
func (b *Budget) claim() bool { return b.Take() == nil }

// refusal is the refusal the budget would give now, of last.
func (b *Budget) refusal(last error) error {
	return (&Refusal{tokens: b.tokens.Load(), inflight: b.inflight.Load()}).Of(last)
}

func TestBucket(t *testing.T) {
	b := New(10, 0.1, 4)
	retry := func(failed bool) {
		t.Helper()
		require.True(t, b.claim(), "a token to claim")
		b.Record(false, failed)
	}
	assert.True(t, b.allow(), "full at first")
	for range 100 {
		b.Record(true, true)
	}
	assert.Equal(t, 10.0, b.Level(), "a first attempt's failure costs nothing")
	for range 9 {
		retry(true)
	}
	assert.Equal(t, 1.0, b.Level(), "a failed retry takes a token")
	assert.True(t, b.allow(), "one token left: one more retry")
	retry(true)
	assert.False(t, b.allow(), "empty")
	assert.False(t, b.claim())
	b.Record(true, false)
	assert.InDelta(t, 0.1, b.Level(), 1e-9, "a first attempt that succeeds puts back TokenRatio")
	assert.False(t, b.allow())
	b.ClaimAnyway()
	b.Record(false, false)
	assert.InDelta(t, 4.1, b.Level(), 1e-9, "a retry that succeeds puts back RetrySuccessTokens")
	assert.True(t, b.allow())
	for range 4 {
		retry(true)
	}
	b.ClaimAnyway() // 0.1 left: a retry that must be made anyway
	b.Record(false, true)
	assert.Zero(t, b.Level(), "never below empty")
	for range 1000 {
		b.Record(true, false)
	}
	assert.Equal(t, 10.0, b.Level(), "never above full")

	// Claims in flight hold their tokens until their outcome is recorded.
	for range 10 {
		require.True(t, b.claim())
	}
	assert.False(t, b.claim(), "every token is claimed")
	assert.False(t, b.allow())
	b.Release()
	assert.True(t, b.claim(), "a released claim frees its token")
	for range 10 {
		b.Record(false, false)
	}
	assert.True(t, b.allow())

	// Concurrent use keeps the count exact.
	b = New(1000, 0.5, 4)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if b.claim() {
					b.Record(false, true)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 200.0, b.Level())
	assert.True(t, b.allow())
}

func TestRefusalSaysWhy(t *testing.T) {
	b := New(10, 0.1, 4)
	for range 10 {
		b.claim()
		b.Record(false, true)
	}
	cause := errors.New("503 Service Unavailable")
	err := b.refusal(cause)
	assert.Equal(t, "retry budget exhausted (0.0 tokens): recent retries failed; not retried: 503 Service Unavailable", err.Error())
	assert.ErrorIs(t, err, cause)
}

func TestRefusalIsErrExhausted(t *testing.T) {
	b := New(1, 0.1, 4)
	assert.ErrorIs(t, b.refusal(nil), ErrExhausted)
	assert.ErrorIs(t, b.refusal(io.ErrUnexpectedEOF), ErrExhausted)
	assert.ErrorIs(t, b.refusal(io.ErrUnexpectedEOF), io.ErrUnexpectedEOF)
}

// Issue 18, item 8: a refusal states the reason that is true of the budget
// when it refused: tokens taken by failed retries, or tokens all claimed by
// retries still in flight (nothing has failed yet).
func TestRefusalReasonIsTrue(t *testing.T) {
	b := New(2, 0.1, 4)
	require.True(t, b.claim())
	require.True(t, b.claim())
	require.False(t, b.claim())
	assert.Equal(t, "retry budget exhausted (2.0 tokens): every whole token is claimed by one of the 2 retries in flight", b.refusal(nil).Error())
	b.Record(false, true) // one fails: 1 token left, claimed by the other
	require.False(t, b.allow())
	assert.NotContains(t, b.refusal(nil).Error(), "failed")
	b.Record(false, true) // the other fails too: nothing left
	require.False(t, b.claim())
	assert.Equal(t, "retry budget exhausted (0.0 tokens): recent retries failed", b.refusal(nil).Error())
	b.ClaimAnyway()
	assert.Equal(t, "retry budget exhausted (0.0 tokens, 1 retries in flight): recent retries failed", b.refusal(nil).Error())
	b.Release()

	// What the loop reports is the budget as it stood when it decided.
	b = New(1, 0.1, 4)
	require.True(t, b.claim())
	why := b.Take()
	require.NotNil(t, why)
	b.Release() // the retry in flight settles before the refusal is read
	assert.Contains(t, why.Error(), "claimed by one of the 1 retries in flight")
	assert.Nil(t, b.Refuses())
}

// changes records what OnChange hears.
type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) on(exhausted bool, why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if exhausted {
		c.got = append(c.got, "exhausted: "+why.Error())
	} else {
		c.got = append(c.got, "recovered")
	}
}

func (c *changes) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// Issue 20: the budget reports its exhaustion once, at the first refusal,
// however many refusals follow, and its recovery once, when half of the
// bucket is unclaimed again, not at the first retry it allows.
func TestExhaustedAndRecoveredOncePerEpisode(t *testing.T) {
	var c changes
	b := New(10, 0.2, 4)
	b.OnChange = c.on
	for range 10 {
		require.True(t, b.claim())
		b.Record(false, true)
	}
	assert.Empty(t, c.all(), "spending every token refuses nothing yet")
	for range 100 {
		assert.False(t, b.allow())
		assert.False(t, b.claim())
	}
	assert.Equal(t, []string{"exhausted: retry budget exhausted (0.0 tokens): recent retries failed"}, c.all(),
		"one exhaustion for 200 refusals")

	// A bucket that hovers near empty stays exhausted: a token refilled
	// allows a retry, which fails.
	for range 20 {
		for range 5 {
			b.Record(true, false)
		}
		require.True(t, b.claim(), "a token refilled allows a retry")
		b.Record(false, true)
		require.False(t, b.claim())
	}
	assert.Len(t, c.all(), 1, "no recovery while the bucket hovers near empty")

	// First attempts that succeed refill it to half: recovered, once.
	for range 24 {
		b.Record(true, false)
	}
	assert.Len(t, c.all(), 1, "4.8 tokens: not yet")
	b.Record(true, false)
	assert.Equal(t, "recovered", c.all()[1], "5 tokens, half of 10")
	for range 100 {
		b.Record(true, false)
	}
	assert.Len(t, c.all(), 2, "recovered once")

	// A second episode: tokens all claimed by retries in flight.
	for range 10 {
		require.True(t, b.claim())
	}
	require.False(t, b.claim())
	require.Len(t, c.all(), 3)
	assert.Contains(t, c.all()[2], "exhausted: retry budget exhausted (10.0 tokens): every whole token is claimed")
	for range 4 {
		b.Record(false, false)
	}
	assert.Len(t, c.all(), 3, "4 unclaimed")
	b.Release()
	assert.Equal(t, "recovered", c.all()[3], "5 unclaimed")
	for range 5 {
		b.Record(false, false)
	}
	assert.Len(t, c.all(), 4)
}

// A budget of one token recovers at one unclaimed token, not half of one;
// a lower maximum set by an update can recover it too.
func TestRecoveredNeedsAToken(t *testing.T) {
	var c changes
	b := New(1, 0.5, 4)
	b.OnChange = c.on
	require.True(t, b.claim())
	b.Record(false, true)
	require.False(t, b.claim())
	b.Record(true, false)
	assert.Len(t, c.all(), 1, "half a token is no recovery")
	b.Record(true, false)
	assert.Equal(t, []string{"exhausted: retry budget exhausted (0.0 tokens): recent retries failed", "recovered"}, c.all())

	c = changes{}
	b = New(10, 0.5, 4)
	b.OnChange = c.on
	for range 10 {
		require.True(t, b.claim())
		b.Record(false, true)
	}
	require.False(t, b.claim(), "empty")
	for range 4 {
		b.Record(true, false)
	}
	require.Len(t, c.all(), 1, "2 tokens of 10")
	b.Set(4, 0.5, 4)
	assert.Equal(t, "recovered", c.all()[1], "2 tokens of 4")
}

func TestPushbackCostsAToken(t *testing.T) {
	b := New(3, 0.1, 4)
	var changes []bool
	b.OnChange = func(exhausted bool, _ error) { changes = append(changes, exhausted) }
	b.Pushback(true)
	assert.Equal(t, 2.0, b.Level(), "a first attempt pushed back costs a token, where its failure costs none")
	assert.Zero(t, b.InFlight())
	require.True(t, b.claim())
	b.Pushback(false)
	assert.Equal(t, 1.0, b.Level(), "a retry pushed back costs a token, as its failure does")
	assert.Zero(t, b.InFlight(), "and settles its claim")
	b.Pushback(true)
	b.Pushback(true)
	assert.Equal(t, 0.0, b.Level(), "never below empty")
	assert.False(t, b.claim())
	assert.Equal(t, []bool{true}, changes)
}
