// Package redislimit shares one rate limit among every replica of a
// client through Redis, for resilience.RateLimitOptions.Shared: a vendor
// API that allows 200 requests per second to the whole account gets 200
// per second from the fleet, not from each pod.
//
// The rate is a GCRA (generic cell rate algorithm) kept in Redis by
// github.com/go-redis/redis_rate. A process leases a batch of permits at
// a time, sized to its own rate of calls and handed out at their pace, so
// most calls make no round trip; a lease not spent within a third of the
// Period expires, so unused permits never pile up into a burst. When
// Redis is slow or down, each process paces its calls at its share of the
// rate (the rate divided by the number of replicas) and goes back to the
// shared rate by itself when Redis answers again. See Limiter for the
// bounds.
package redislimit
