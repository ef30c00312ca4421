package sqlitestore

// SetBeforeBegin makes Claim call f between the claim's commit and the
// BEGIN IMMEDIATE of its owner's transaction: tests run a sweep there.
func SetBeforeBegin(s *Store, f func()) { s.beforeBegin = f }
