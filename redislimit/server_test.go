package redislimit

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A redisServer is a redis-server process this test started, which the
// test can kill and start again on the same port.
type redisServer struct {
	t    *testing.T
	bin  string
	port int
	dir  string
	args []string // more arguments to redis-server
	cmd  *exec.Cmd
}

// redisAddr returns the address of a real Redis for the test: the one
// RESILIENCE_TEST_REDIS_ADDR names (CI starts it), or one the test starts
// from redis-server on the PATH. Without either the test is skipped,
// loudly, unless RESILIENCE_REQUIRE_SERVERS=1 makes that a failure.
func redisAddr(t *testing.T) string {
	t.Helper()
	if addr := os.Getenv("RESILIENCE_TEST_REDIS_ADDR"); addr != "" {
		return addr
	}
	return startRedis(t).addr()
}

// startRedis starts a redis-server of the test's own, on a free loopback
// port, stopped when the test ends; args are more arguments to it.
func startRedis(t *testing.T, args ...string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missingServer(t, "redis-server is not on the PATH (Debian: apt-get install redis-server)")
	}
	s := &redisServer{t: t, bin: bin, port: freePort(t), dir: t.TempDir(), args: args}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func missingServer(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("RESILIENCE_REQUIRE_SERVERS") == "1" {
		t.Fatalf("RESILIENCE_REQUIRE_SERVERS=1 and no Redis to test against: %s", why)
	}
	t.Skipf("SKIPPED: no real Redis to test against: %s; set RESILIENCE_TEST_REDIS_ADDR or put redis-server on the PATH", why)
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start runs redis-server in the foreground (so that kill reaches it) and
// waits until it answers.
func (s *redisServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)...)
	require.NoError(s.t, s.cmd.Start())
	rdb := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on %s did not answer within 10s: %v\n%s", s.addr(), err, log)
		}
		time.Sleep(10 * time.Millisecond) // polling a process's start-up, not timing a test
	}
}

// kill stops the server at once, as a crash would.
func (s *redisServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newClient is a go-redis client of addr, closed when the test ends.
func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// testPrefix keeps each test's keys apart on a shared server.
func testPrefix(t *testing.T) string {
	return fmt.Sprintf("test:%s:%d:", t.Name(), time.Now().UnixNano())
}

// benchRedis is the Redis of a benchmark: RESILIENCE_TEST_REDIS_ADDR, or
// the benchmark is skipped (bench/run.sh starts one).
func benchRedis(b *testing.B) string {
	addr := os.Getenv("RESILIENCE_TEST_REDIS_ADDR")
	if addr == "" {
		b.Skip("SKIPPED: set RESILIENCE_TEST_REDIS_ADDR to a redis-server (bench/run.sh starts one)")
	}
	return addr
}

func newBenchClient(addr string) *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }
