//go:build !linux

package overload

import "time"

// cpuTimes says the threads' times cannot be read: only Linux's are
// (cputimes_linux.go). The stall meter has the Go scheduler's view alone.
func cpuTimes() (waited, ran time.Duration, ok bool) { return 0, 0, false }
