package resilience

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOverloadOptionsDefaultsAndValidation(t *testing.T) {
	cfg, err := resolve(Options{})
	require.NoError(t, err)
	assert.Equal(t, OverloadOptions{MinLimit: defaultOverloadMinLimit, MaxLimit: defaultOverloadMaxLimit,
		InitialLimit: defaultOverloadInitialLimit, MaxQueue: defaultOverloadMaxQueue, MaxQueueWait: defaultOverloadMaxQueueWait}, cfg.Overload)

	cfg, err = resolve(Options{Overload: OverloadOptions{Disabled: true}})
	require.NoError(t, err)
	assert.True(t, cfg.Overload.Disabled)
	_, err = NewHandler(Options{Name: "x", Overload: OverloadOptions{Disabled: true, MinLimit: -1}})
	assert.EqualError(t, err, `resilience: handler "x": invalid option Overload.MinLimit (-1): must not be negative`, "validated even when disabled")

	for _, tc := range []struct {
		o    OverloadOptions
		want string
	}{
		{OverloadOptions{MinLimit: -1}, `invalid option Overload.MinLimit (-1): must not be negative`},
		{OverloadOptions{MaxQueueWait: -time.Second}, `invalid option Overload.MaxQueueWait (-1s): must not be negative`},
		{OverloadOptions{MinLimit: 50, MaxLimit: 10}, `invalid option Overload.MinLimit (50): must not exceed Overload.MaxLimit (10)`},
		{OverloadOptions{MaxLimit: 100, InitialLimit: 5000}, `invalid option Overload.InitialLimit (5000): must not exceed Overload.MaxLimit (100)`},
	} {
		_, err := NewHandler(Options{Name: "x", Overload: tc.o})
		assert.EqualError(t, err, `resilience: handler "x": `+tc.want)
	}
}

func TestOverloadConfig(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader(`{
	  "defaults": {"overload": {"maxQueueWait": "250ms"}},
	  "upstreams": {"pricing": {"overload": {"minLimit": 4, "maxLimit": 64, "initialLimit": 16, "maxQueue": 100}}, "search": {"overload": {"disabled": true}}}
	}`))
	require.NoError(t, err)
	assert.Equal(t, OverloadOptions{MinLimit: 4, MaxLimit: 64, InitialLimit: 16, MaxQueue: 100, MaxQueueWait: 250 * time.Millisecond},
		cfg.Upstreams["pricing"].Overload)
	assert.True(t, cfg.Upstreams["search"].Overload.Disabled)

	_, err = LoadConfig(strings.NewReader(`{"upstreams": {"pricing": {"overload": {"minLimit": -3}}}}`))
	assert.ErrorContains(t, err, `upstreams.pricing.overload.minLimit (-3): must not be negative`)
	cfg, err = LoadConfig(strings.NewReader(`{"upstreams": {"pricing": {"overload": {"maxQueue": 0}}}}`))
	require.NoError(t, err, "a written 0 is the default, as in Options")
	h, err := NewHandler(cfg.Upstreams["pricing"])
	require.NoError(t, err)
	assert.Equal(t, defaultOverloadMaxQueue, h.Options().Overload.MaxQueue)
}
