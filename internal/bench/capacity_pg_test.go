package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/store/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestCapacityChecksThePeersTablesFirst: run as a role that may not create
// the peer's tables (the services' runtime role), capacity ends before the
// claimflow arm sends a request, and says which URL to set.
func TestCapacityChecksThePeersTablesFirst(t *testing.T) {
	db, _ := pgtest.DB(t) // the runtime role: DML only
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	o := DefaultCapacity()
	// One short step, so that a run that does not check first ends soon too.
	o.StartRate, o.MaxRate, o.StepDuration, o.Window = 5, 5, time.Second, time.Second
	o.Courses, o.DrainTimeout = 1, time.Second
	o.DB, o.PeerDB = db, db
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := RunCapacity(ctx, o, Arm{Name: "claimflow", URL: srv.URL, Schema: ClaimflowSchema})
	if err == nil || !strings.Contains(err.Error(), "MIGRATE_DATABASE_URL") || !strings.Contains(err.Error(), "before either arm") {
		t.Fatalf("RunCapacity as the runtime role: %v; want the peer's tables refused before either arm, naming MIGRATE_DATABASE_URL", err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the claimflow arm sent %d requests before the peer's tables were checked", n)
	}
}
