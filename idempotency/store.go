package idempotency

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"time"
)

// A Store keeps idempotency keys durably. Claim must be atomic: of any
// number of concurrent claims of one Key, at most one is Owned until that
// owner completes or aborts, or dies. Implementations: sqlitestore and
// pgstore; storetest.Run checks this contract.
//
// The lease protects against an owner that died (its process crashed, its
// connection to the database dropped) and so will never complete: once it
// has expired, a request with the same digest may take the key over. It
// does not take the key from an owner that is alive but slow: while an
// owner's Txn is open (neither committed nor aborted, and not ended by the
// database) its key is never claimed again, whatever its lease, and its
// Commit lands. A claim of such a key reports InProgress, or (a store with
// one writer at a time, as SQLite's) waits until the owner's transaction
// ends and reports what it left. So the handler never runs twice at once
// for one key, even past its lease. The module's stores tie the claim to
// the owner's database transaction: SQLite's owner holds the write lock,
// PostgreSQL's locks its key's row, and the database ends both with the
// owner's connection.
type Store interface {
	// Claim looks the key up and claims it when it is free: absent, past
	// its TTL, or in progress with an expired lease, the same digest and
	// an owner whose transaction has ended. An Owned claim carries the
	// owner's transaction, already begun.
	//
	// If it fails after recording the claim (the database went away
	// before the owner's transaction began), it returns its error with a
	// Claim whose Txn holds that claim, and nothing else: its caller must
	// Abort it, as after a failed Commit, to release the key before its
	// lease ends (the middleware does, again until the release lands).
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)

	// Sweep deletes up to limit keys whose retention (TTL) has passed. It
	// reports how many it deleted, and its lag: how long the oldest key
	// past its TTL had been so when the sweep began (zero if no key had
	// expired). The middleware calls it again at once while it deletes
	// full batches, so a store need not delete more than limit at a time.
	Sweep(ctx context.Context, limit int) (deleted int, lag time.Duration, err error)
}

// A KeyCounter is a Store that can tell how many keys it holds, for the
// Kept of a SweepReport. The module's stores are KeyCounters.
type KeyCounter interface {
	// CountKeys returns how many keys the store holds, expired ones not
	// yet swept included: an exact count or a close estimate, as cheap as
	// the store can make it.
	CountKeys(ctx context.Context) (int, error)
}

// A Key names one logical operation of one principal.
type Key struct {
	Principal string // who: the caller, as the principal function says
	Operation string // what: the method and route, "POST /orders"
	Key       string // the caller's idempotency key
}

// Hash returns a fixed-size name for k: the SHA-256 of its three parts,
// each prefixed with its length. The module's stores keep and index a key
// by its hash alone, so that its row stays small whatever the length of
// the route or the principal (PostgreSQL refuses an index entry over 2,704
// bytes).
func (k Key) Hash() [sha256.Size]byte {
	h := sha256.New()
	field(h, k.Principal)
	field(h, k.Operation)
	field(h, k.Key)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// A Digest is the SHA-256 of a canonical request.
type Digest [sha256.Size]byte

// A ClaimRequest asks a Store to claim Key for a request with Digest.
type ClaimRequest struct {
	Key    Key
	Digest Digest
	// Lease is how long the claim stays in progress before another request
	// with the same digest may take the key over, if its owner is dead: a
	// live owner's transaction keeps the key past its lease.
	Lease time.Duration
	// TTL is how long the key is kept, from its claim and again from its
	// completion; past it the key is free again.
	TTL time.Duration
}

// State is what a Claim found.
type State int

const (
	// Owned: the key is claimed for this request; Claim.Txn is its
	// transaction.
	Owned State = iota + 1
	// InProgress: another request holds the key and has not completed.
	InProgress
	// Completed: the key's request completed; Claim.Response is its answer.
	Completed
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Owned:
		return "owned"
	case InProgress:
		return "in progress"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// A Claim is the outcome of Store.Claim.
type Claim struct {
	State State
	// Digest is the digest recorded with the key (InProgress, Completed).
	Digest Digest
	// LeaseLeft is how long the holder's lease still runs (InProgress).
	LeaseLeft time.Duration
	// Response is the recorded response (Completed).
	Response *Response
	// Txn is the owner's transaction (Owned).
	Txn Txn
}

// A Txn is the owner's transaction: the handler's writes through it and the
// recorded response commit together, or not at all.
type Txn interface {
	// Context returns ctx carrying the transaction, for the store's
	// accessor (sqlitestore.Tx, pgstore.Tx).
	Context(ctx context.Context) context.Context

	// Commit records resp, completes the key and commits, in one
	// transaction. If the claim was lost (another request took the key
	// over, which a Store allows only once this owner's transaction has
	// ended), it rolls back and returns ErrClaimLost.
	Commit(ctx context.Context, resp *Response) error

	// Abort rolls the transaction back and releases the claim, so that a
	// retry may run at once. It releases only a claim this owner still
	// holds (not a key its commit completed, nor one taken over), so it is
	// safe after a Commit that failed, whose outcome is unknown. When it
	// fails (the database is down), it may be called again, and then
	// retries the release: the middleware does so until it succeeds or
	// the lease ends.
	Abort(ctx context.Context) error
}

// A Response is a recorded response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// ErrClaimLost is returned by Txn.Commit when another request took the key
// over: the transaction was rolled back. The module's stores never take
// over a live owner's key, so their owners do not see it; the check (each
// claim's token) stays, so that at most one commit per key ever lands.
var ErrClaimLost = errors.New("idempotency: claim lost: the lease expired and another request took the key over")
