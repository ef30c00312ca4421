// Package idempotency is the server half of the idempotency-key protocol:
// an http.Handler middleware that makes a write safe to retry by running it
// at most once per (principal, operation, key), and replaying its recorded
// response to every retry.
//
// It keeps a durable state machine per key:
//
//	key     = (principal, method + route, the caller's Idempotency-Key),
//	          stored as its SHA-256 (Key.Hash), so a row stays small
//	digest  = SHA-256 of the canonical request (method, path, query, body,
//	          and the headers named in Options.DigestHeaders)
//	claim   = atomic insert of (key, digest, in progress, lease) under a
//	          unique constraint
//	  same key, other digest   -> 422 Unprocessable Content (never retried)
//	  same key, in progress    -> 409 Conflict with Retry-After
//	  same key, completed      -> the recorded status, headers and body,
//	                              marked Idempotent-Replayed: true
//	owner   = run the handler inside the store's transaction, then record
//	          the response and complete the key in that same transaction,
//	          and commit both together
//
// The principal function runs first, before the store is touched: a request
// it refuses gets 401 or 403 and never learns whether its key exists.
//
// The effect is exactly-once only for what the handler writes through the
// transaction the middleware gives it (sqlitestore.Tx or pgstore.Tx of the
// request's context). Anything else the handler does (a charge at a payment
// provider, a message sent, a write to another database) is outside that
// transaction: a crash after that effect and before the commit leaves the key
// claimable again once its lease runs out, and the retry repeats the effect.
// Such effects need the downstream system's own idempotency key or an outbox
// and reconciliation; recording the response cannot make them safe.
//
// A handler that fails with a 5xx status rolls its transaction back and
// releases the key, so a retry runs it again; any status below 500 is
// recorded and replayed. A process killed after the commit leaves a
// completed key that replays.
//
// Releasing a claim, and the lease. A claim is released (its row deleted,
// if it still carries the owner's token) by the owner itself, once its
// handler has returned and it knows it did not commit: a 5xx, a panic, a
// response too large, or a commit that failed (whose outcome is unknown:
// the release never touches a key a commit completed, nor one another
// request took over); or before its handler runs, when the claim was
// recorded and the owner's transaction could not begin. If the release
// fails too, as when the database went down with the owner's transaction,
// the owner answers 503 with
// Retry-After: 1 and keeps trying it in the background (every 50 ms, then
// up to every 500 ms) until the database answers again or the lease runs
// out: the key is usable within about half a second of the database's
// return, and the handler, which has returned, never runs twice at once.
// The lease (Options.Lease, default 10 s) is for owners that died: a
// process killed between the claim and the commit leaves an in-progress
// claim that nobody releases, and the same request may claim the key again
// once the lease has expired. A live owner is never taken over, even past
// its lease: its open transaction holds the key (see Store).
//
// Stores: sqlitestore (modernc.org/sqlite, pure Go, embedded) and pgstore
// (PostgreSQL through jackc/pgx/v5, for a fleet of servers), each in its own
// package so a program links only the driver it uses.
package idempotency
