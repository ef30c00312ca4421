package resiliencetest_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/resilienthttp/resilience/resiliencetest"
)

type Fault = resiliencetest.Fault

func draw(s *resiliencetest.Script, n int) []Fault {
	out := make([]Fault, n)
	for i := range out {
		out[i] = s.Next()
	}
	return out
}

func TestSequenceRepeatsTheLastFault(t *testing.T) {
	s := resiliencetest.Sequence(Fault{Status: 503}, Fault{Status: 429, RetryAfter: "1"}, Fault{})
	assert.Equal(t, []Fault{{Status: 503}, {Status: 429, RetryAfter: "1"}, {}, {}, {}}, draw(s, 5))

	assert.Equal(t, []Fault{{}, {}}, draw(resiliencetest.Sequence(), 2))

	var nilScript *resiliencetest.Script
	assert.Equal(t, Fault{}, nilScript.Next())
}

func TestSequenceCopiesItsFaults(t *testing.T) {
	faults := []Fault{{Status: 503}}
	s := resiliencetest.Sequence(faults...)
	faults[0].Status = 200
	assert.Equal(t, 503, s.Next().Status)
}

func TestFuncGetsRequestNumbers(t *testing.T) {
	faults := []Fault{{Status: 503}, {}}
	s := resiliencetest.Func(func(n int) Fault { return faults[n%len(faults)] })
	assert.Equal(t, []Fault{{Status: 503}, {}, {Status: 503}, {}}, draw(s, 4))
	assert.PanicsWithValue(t, "resiliencetest: Func: nil function", func() { resiliencetest.Func(nil) })
}

func TestMixIsDeterministicForASeed(t *testing.T) {
	choices := []resiliencetest.Weighted{
		{Weight: 0.7, Fault: Fault{}},
		{Weight: 0.2, Fault: Fault{Status: 503}},
		{Weight: 0.1, Fault: Fault{Reset: true}},
		{Weight: 0, Fault: Fault{Status: 418}},
	}
	a := draw(resiliencetest.Mix(42, choices...), 10000)
	b := draw(resiliencetest.Mix(42, choices...), 10000)
	c := draw(resiliencetest.Mix(43, choices...), 10000)
	assert.Equal(t, a, b, "same seed, same faults")
	assert.NotEqual(t, a, c, "another seed, other faults")

	counts := map[int]int{}
	for _, f := range a {
		switch {
		case f.Reset:
			counts[-1]++
		default:
			counts[f.Status]++
		}
	}
	assert.InDelta(t, 7000, counts[0], 300)
	assert.InDelta(t, 2000, counts[503], 300)
	assert.InDelta(t, 1000, counts[-1], 300)
	assert.Zero(t, counts[418], "a zero weight is never drawn")
}

func TestMixRejectsBadWeights(t *testing.T) {
	for name, ws := range map[string][]resiliencetest.Weighted{
		"none":     nil,
		"all zero": {{Weight: 0}},
		"negative": {{Weight: 1}, {Weight: -1}},
		"NaN":      {{Weight: math.NaN()}},
		"infinite": {{Weight: math.Inf(1)}},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				assert.Contains(t, msg, "resiliencetest: Mix: ")
			}()
			resiliencetest.Mix(1, ws...)
		})
	}
}

func TestScriptIsSafeForConcurrentUse(t *testing.T) {
	const workers, each = 8, 500
	s := resiliencetest.Func(func(n int) Fault { return Fault{Status: 200 + n%2} })
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[int]int{}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[int]int{}
			for range each {
				local[s.Next().Status]++
			}
			mu.Lock()
			for k, v := range local {
				counts[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{200: workers * each / 2, 201: workers * each / 2}, counts)
}
