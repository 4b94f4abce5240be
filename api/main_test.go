package api

import (
	"testing"

	"github.com/claimflow/claimflow/dev/pgtest"
)

// The tests that need the database (owner checks, the Postgres fuzz target)
// run on pgtest's private PostgreSQL cluster, started on first use and
// stopped here.
func TestMain(m *testing.M) { pgtest.Main(m) }
