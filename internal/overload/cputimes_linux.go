package overload

import (
	"os"
	"time"
)

// cpuTimes returns how long the process's threads, together, have waited
// for a CPU while runnable, and run on one, since each started: the first
// two fields of each /proc/self/task/*/schedstat (time on a CPU, time
// waiting on a run queue, both in nanoseconds, and the timeslices run).
// ok is false where they cannot be read (a sandbox that hides /proc).
func cpuTimes() (waited, ran time.Duration, ok bool) {
	dir, err := os.Open("/proc/self/task")
	if err != nil {
		return 0, 0, false
	}
	names, err := dir.Readdirnames(-1)
	dir.Close()
	if err != nil {
		return 0, 0, false
	}
	var buf [96]byte
	for _, name := range names {
		f, err := os.Open("/proc/self/task/" + name + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		n, _ := f.Read(buf[:])
		f.Close()
		r, w, good := parseSchedstat(buf[:n])
		if !good {
			return 0, 0, false
		}
		waited += w
		ran += r
		ok = true
	}
	return waited, ran, ok
}

// parseSchedstat parses the first two fields of a schedstat line.
func parseSchedstat(b []byte) (ran, waited time.Duration, ok bool) {
	var v [2]int64
	i := 0
	for k := range v {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			v[k] = v[k]*10 + int64(b[i]-'0')
			i++
		}
		if i == start || i == len(b) || (b[i] != ' ' && b[i] != '\n') {
			return 0, 0, false
		}
		i++
	}
	return time.Duration(v[0]), time.Duration(v[1]), true
}
