package pgtest

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Cluster is a PostgreSQL server of one test's own, which the test may
// crash and start again: initdb into a temporary directory, listening on a
// Unix socket there only (no port to collide on). As root, the server runs
// as the postgres user, as initdb requires.
type Cluster struct {
	// DSN connects to the cluster's postgres database as postgres.
	DSN string

	bin, dir string
	asUser   string // "postgres" when run as root
}

// NewCluster starts a cluster for t, stopped when t ends. It needs
// PostgreSQL's server binaries: RESILIENCE_TEST_POSTGRES_BIN names their
// directory (.ci/postgres.sh sets it), else Debian's /usr/lib/postgresql/*/bin
// or the PATH. Without them the test is skipped, loudly, unless
// RESILIENCE_REQUIRE_SERVERS=1, when it fails.
func NewCluster(t testing.TB) *Cluster {
	bin := serverBin()
	if bin == "" {
		msg := "PostgreSQL's server binaries (initdb, pg_ctl) not found: set RESILIENCE_TEST_POSTGRES_BIN (source .ci/postgres.sh)"
		if os.Getenv("RESILIENCE_REQUIRE_SERVERS") == "1" {
			t.Fatalf("%s, and RESILIENCE_REQUIRE_SERVERS=1", msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "idempotency-pg-")
	require.NoError(t, err)
	c := &Cluster{bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "as root, the cluster runs as the postgres user")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		c.asUser = "postgres"
	}
	t.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate").Run()
		_ = os.RemoveAll(dir)
	})
	out, err := c.command(filepath.Join(bin, "initdb"), "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	c.DSN = "host=" + dir + " user=postgres dbname=postgres sslmode=disable connect_timeout=5"
	c.Start(t)
	return c
}

// Crash stops the server at once, as a crash does: every connection drops,
// nothing is checkpointed, and the next start recovers from the log.
func (c *Cluster) Crash(t testing.TB) {
	out, err := c.pgctl("stop", "-m", "immediate").CombinedOutput()
	require.NoError(t, err, "pg_ctl stop -m immediate: %s", out)
}

// Start starts the server and returns once it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	out, err := c.pgctl("start", "-w", "-t", "60", "-l", filepath.Join(c.dir, "log"),
		"-o", "-c listen_addresses='' -k "+c.dir+" -c fsync=off").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		require.NoError(t, err, "pg_ctl start: %s\n%s", out, log)
	}
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) pgctl(args ...string) *exec.Cmd {
	return c.command(filepath.Join(c.bin, "pg_ctl"), append([]string{"-D", c.data()}, args...)...)
}

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	if c.asUser != "" {
		args = append([]string{"-u", c.asUser, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// serverBin returns the directory of initdb and pg_ctl, or "".
func serverBin() string {
	if d := os.Getenv("RESILIENCE_TEST_POSTGRES_BIN"); d != "" {
		return d
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}
