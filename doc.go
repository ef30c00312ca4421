// Package resilience gives any http.Client the standard resilience handler
// that .NET users get from Microsoft.Extensions.Http.Resilience and Polly v8,
// as an http.RoundTripper:
//
//	t, err := resilience.NewTransport(nil, resilience.Options{Name: "pricing"})
//	if err != nil {
//		return err
//	}
//	client := &http.Client{Transport: t}
//
// Every call goes through, outermost first: admission control (a concurrency
// limit, and optionally a rate), a total deadline, retries of transient
// failures of requests that are safe to repeat (jittered backoff, Retry-After
// honoured, a retry budget), a circuit breaker, and a per-attempt deadline.
// Options{} is the standard handler, and so is the zero Transport.
//
// One Handler per upstream holds its state (NewHandler); its Transport
// method gives clients that share it. LoadConfig and Config.Handlers build
// named handlers from a file; CheckHealth and HealthHandler report their
// circuits. IsTransient is the classification retries and the breaker use.
//
// The handler never repeats a request its method rule does not allow, never
// modifies the caller's request, drains and closes every response it retries,
// classifies failures by type and by the request's context (never by text an
// upstream sent), and returns the last response untouched when retries run
// out.
package resilience
