// Package resilience makes an http.Client resilient with an http.RoundTripper:
// the standard handler of .NET's Microsoft.Extensions.Http.Resilience, that is
// admission control, a total timeout, retries with a budget, a circuit breaker,
// an overload limiter and an attempt timeout, with hedging and fallback when
// enabled. [Options]{} is the standard handler, and so is the zero [Transport];
// [NewTransport] makes one. Share one [Handler] per upstream among its clients.
// See docs/ for each concern.
package resilience
