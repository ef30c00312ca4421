// Package resilience provides .NET's standard resilience handler as an
// http.RoundTripper: admission control, a total timeout, retries with a
// budget, a circuit breaker, an overload limiter and an attempt timeout, and
// hedging and fallback when enabled. [Options]{} is the standard handler, as
// is the zero [Transport]; [NewTransport] makes one. Share one [Handler] per
// upstream. Each concern has a page in docs/.
package resilience
