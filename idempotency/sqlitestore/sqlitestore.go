// Package sqlitestore keeps idempotency keys in SQLite through
// modernc.org/sqlite, a pure-Go driver (no cgo): the embedded default store
// for one server process, or several on one machine sharing the file.
//
// The handler writes its effect through Tx(r.Context()), the *sql.Tx the
// middleware began for it; the recorded response commits in that same
// transaction. Open the database with Open, which sets what the protocol
// needs: WAL (readers, and so 409s and replays, never wait for the writer),
// a busy timeout, and BEGIN IMMEDIATE transactions (a handler that reads
// then writes cannot fail with SQLITE_BUSY halfway). SQLite has one writer
// at a time: owners' transactions run one after another, and a handler that
// writes through the *sql.DB instead of Tx waits on its own transaction
// until the busy timeout.
//
// An owner's transaction holds the write lock while it is open, and its
// claim is made again inside it (see Store.Claim), so a live owner keeps
// its key past its lease and its TTL: a claim that would take it over
// waits for the lock (up to the busy timeout) and then finds the key
// completed or released; the owner's Commit lands. An owner that dies
// releases the lock with its process, and its key is free once its lease
// has expired.
package sqlitestore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/resilienthttp/resilience/idempotency"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Open opens the SQLite database at path (created if absent) as the store
// needs it: WAL journal, busy timeout 10s, immediate transactions, foreign
// keys on.
func Open(path string) (*sql.DB, error) {
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	return db, nil
}

const schema = `CREATE TABLE IF NOT EXISTS idempotency_keys (
	key_hash    BLOB    NOT NULL PRIMARY KEY, -- idempotency.Key.Hash: (principal, operation, key), fixed size
	digest      BLOB    NOT NULL,
	token       BLOB,              -- the owner's claim token; NULL once completed
	lease_until INTEGER NOT NULL,  -- unix ns; 0 once completed
	expires_at  INTEGER NOT NULL,  -- unix ns
	status      INTEGER NOT NULL DEFAULT 0, -- 0 while in progress
	header      BLOB,
	body        BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);`

// A Store is an idempotency.Store in a SQLite database, in the table
// idempotency_keys.
type Store struct {
	db *sql.DB
	// beforeBegin, when set (by tests), runs in Claim between the claim's
	// commit and the BEGIN IMMEDIATE of its owner's transaction.
	beforeBegin func()
}

// New creates the store's table in db if absent and returns the Store.
// db should come from Open.
func New(ctx context.Context, db *sql.DB) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: nil *sql.DB")
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("sqlitestore: create table idempotency_keys: %w", err)
	}
	if _, err := db.ExecContext(ctx, `SELECT key_hash FROM idempotency_keys LIMIT 0`); err != nil {
		return nil, fmt.Errorf("sqlitestore: table idempotency_keys has an earlier layout (keys by principal, operation and key, not key_hash): rename it, and drop it once its keys' TTL has passed: %w", err)
	}
	return &Store{db: db}, nil
}

type ctxKey struct{}

// Tx returns the transaction the middleware began for the request whose
// context is ctx, or nil outside an owned request: in particular for a
// write that carries no key, which goes to the handler unprotected unless
// Options.RequireKey is set (a client call made with
// resilience.WithRetryable(ctx, false) sends none). Check for nil before
// using it. Write the handler's effect through it: it commits with the
// recorded response, or not at all. Do not commit or roll it back
// yourself.
func Tx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(ctxKey{}).(*sql.Tx)
	return tx
}

// maxTries bounds the claim loop, which only repeats when the key changed
// between the lookup and the insert.
const maxTries = 3

// claimKey claims the key ?1 for the digest ?2 and the token ?3, with the
// lease and TTL ending at ?4 and ?5, if it is free at ?6 (now): absent,
// past its TTL, in progress with an expired lease and the same digest, or
// already claimed by the token ?3 (the claim made again in its owner's
// transaction). One row affected: claimed.
const claimKey = `INSERT INTO idempotency_keys
		(key_hash, digest, token, lease_until, expires_at, status)
	VALUES (?1, ?2, ?3, ?4, ?5, 0)
	ON CONFLICT (key_hash) DO UPDATE SET
		digest = excluded.digest, token = excluded.token, lease_until = excluded.lease_until,
		expires_at = excluded.expires_at, status = 0, header = NULL, body = NULL
	WHERE idempotency_keys.token = excluded.token
		OR idempotency_keys.expires_at <= ?6
		OR (idempotency_keys.status = 0 AND idempotency_keys.lease_until <= ?6
			AND idempotency_keys.digest = excluded.digest)`

// claimArgs are claimKey's arguments for req, k and token, from now.
func claimArgs(req idempotency.ClaimRequest, k keyHash, token []byte) []any {
	now := time.Now().UnixNano()
	return []any{k[:], req.Digest[:], token, now + int64(req.Lease), now + int64(req.TTL), now}
}

// Claim implements idempotency.Store. The claim is made twice: first on
// its own, committed at once, so that other requests see the key in
// progress (readers never wait for the writer); then again inside the
// owner's transaction, once its BEGIN IMMEDIATE holds the write lock, with
// its lease and TTL from then. Between the two, the claim holds no lock,
// and the BEGIN may wait up to the busy timeout while other owners write:
// a sweep can delete the claim once its TTL has passed, or a retry of the
// key take it over once its lease has. The second claim, under the lock,
// finds that out before the handler runs: a claim swept meanwhile is made
// again, and a claim that another request of the key took over is lost,
// and looked up again. From then on nothing else writes until the owner's
// transaction ends, so its claim holds until its commit.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	k := req.Key.Hash()
	for range maxTries {
		now := time.Now().UnixNano()
		var (
			digest           []byte
			token            []byte
			leaseUntil, exp  int64
			status           int
			header, respBody []byte
		)
		err := s.db.QueryRowContext(ctx, `SELECT digest, token, lease_until, expires_at, status, header, body
			FROM idempotency_keys WHERE key_hash = ?`,
			k[:]).Scan(&digest, &token, &leaseUntil, &exp, &status, &header, &respBody)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return idempotency.Claim{}, fmt.Errorf("sqlitestore: look up key: %w", err)
		case exp > now: // live
			var d idempotency.Digest
			copy(d[:], digest)
			if status != 0 {
				resp := &idempotency.Response{Status: status, Body: respBody}
				if err := json.Unmarshal(header, &resp.Header); err != nil {
					return idempotency.Claim{}, fmt.Errorf("sqlitestore: decode recorded header: %w", err)
				}
				return idempotency.Claim{State: idempotency.Completed, Digest: d, Response: resp}, nil
			}
			if leaseUntil > now || d != req.Digest {
				return idempotency.Claim{State: idempotency.InProgress, Digest: d, LeaseLeft: time.Duration(leaseUntil - now)}, nil
			}
			// An expired lease with the same digest: take it over below.
		}
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		res, err := s.db.ExecContext(ctx, claimKey, claimArgs(req, k, tok)...)
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("sqlitestore: claim key: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			continue // another request claimed or completed it meanwhile: look again
		}
		if s.beforeBegin != nil {
			s.beforeBegin()
		}
		// On failure from here the claim may stay recorded: the caller
		// releases it through the claim's Txn (idempotency.Store).
		claimOnly := idempotency.Claim{Txn: &txn{s: s, key: k, token: tok, ttl: req.TTL}}
		// The transaction outlives the request's cancellation: the
		// middleware commits or aborts it.
		tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
		if err != nil {
			return claimOnly, fmt.Errorf("sqlitestore: begin: %w", err)
		}
		res, err = tx.ExecContext(ctx, claimKey, claimArgs(req, k, tok)...)
		if err != nil {
			_ = tx.Rollback()
			return claimOnly, fmt.Errorf("sqlitestore: claim key in its transaction: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			_ = tx.Rollback()
			continue // another request took the key over before the lock: look again
		}
		return idempotency.Claim{State: idempotency.Owned, Txn: &txn{s: s, tx: tx, key: k, token: tok, ttl: req.TTL}}, nil
	}
	return idempotency.Claim{}, fmt.Errorf("sqlitestore: key kept changing during %d claims", maxTries)
}

// keyHash is the hash by which the table keeps a key (idempotency.Key.Hash).
type keyHash = [32]byte

// release deletes the claim of token, if it still holds: not a key a
// commit completed (its token is NULL), nor one another claim took over.
func (s *Store) release(ctx context.Context, k keyHash, token []byte) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys
		WHERE key_hash = ? AND token = ?`, k[:], token)
	return err
}

// Sweep implements idempotency.Store: the oldest expiry (through the
// index on expires_at), then the deletion.
func (s *Store) Sweep(ctx context.Context, limit int) (int, time.Duration, error) {
	now := time.Now().UnixNano()
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT min(expires_at) FROM idempotency_keys`).Scan(&oldest); err != nil {
		return 0, 0, fmt.Errorf("sqlitestore: sweep: %w", err)
	}
	if !oldest.Valid || oldest.Int64 > now {
		return 0, 0, nil // nothing expired
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys
		WHERE key_hash IN (
			SELECT key_hash FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)`,
		now, limit)
	if err != nil {
		return 0, 0, fmt.Errorf("sqlitestore: sweep: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), time.Duration(now - oldest.Int64), nil
}

// CountKeys implements idempotency.KeyCounter with an exact count, which
// reads the smallest index of the table: about 35 ms per million keys
// (measured on a shared 2-core machine), once per sweep.
func (s *Store) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlitestore: count keys: %w", err)
	}
	return n, nil
}

// A txn is an owner's transaction and claim; tx is nil for a claim whose
// transaction could not begin, which only Abort releases.
type txn struct {
	s     *Store
	tx    *sql.Tx
	key   keyHash
	token []byte
	ttl   time.Duration
}

func (t *txn) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, t.tx)
}

func (t *txn) Commit(ctx context.Context, resp *idempotency.Response) error {
	if t.tx == nil {
		return errors.New("sqlitestore: commit: the claim's transaction never began")
	}
	header, err := json.Marshal(resp.Header)
	if err != nil {
		_ = t.tx.Rollback()
		return fmt.Errorf("sqlitestore: encode header: %w", err)
	}
	if resp.Header == nil {
		header = []byte("{}")
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	res, err := t.tx.ExecContext(ctx, `UPDATE idempotency_keys
		SET status = ?, header = ?, body = ?, token = NULL, lease_until = 0, expires_at = ?
		WHERE key_hash = ? AND token = ?`,
		resp.Status, header, body, time.Now().Add(t.ttl).UnixNano(), t.key[:], t.token)
	if err != nil {
		_ = t.tx.Rollback()
		return fmt.Errorf("sqlitestore: record response: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		_ = t.tx.Rollback()
		return idempotency.ErrClaimLost
	}
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: commit: %w", err)
	}
	return nil
}

func (t *txn) Abort(ctx context.Context) error {
	var err error
	if t.tx != nil {
		err = t.tx.Rollback()
	}
	if errors.Is(err, sql.ErrTxDone) {
		err = nil
	}
	if rerr := t.s.release(ctx, t.key, t.token); rerr != nil {
		return fmt.Errorf("sqlitestore: release claim: %w", rerr)
	}
	return err
}
