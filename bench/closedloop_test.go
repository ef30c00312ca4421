package bench

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// closedLoop makes calls GETs of url?k=<n> through c from workers
// goroutines, each sending its next call when the last has returned, and
// returns every call's latency, unsorted, and how many failed.
func closedLoop(c *http.Client, calls, workers int, url string) (lat []time.Duration, failed int) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
	)
	lat = make([]time.Duration, 0, calls)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := next.Add(1) - 1
				if k >= int64(calls) {
					return
				}
				req, err := http.NewRequest(http.MethodGet, url+"?k="+strconv.FormatInt(k, 10), nil)
				if err != nil {
					panic(err)
				}
				t0 := time.Now()
				err = do(c, req)
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				if err != nil {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, failed
}
