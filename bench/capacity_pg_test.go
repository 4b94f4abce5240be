package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestTwoArmRunsCheckThePeersTablesFirst: run as a role that may not create
// the peer's tables (the services' runtime role), capacity and compare end
// before the claimflow arm sends a request, and say which URL to set.
func TestTwoArmRunsCheckThePeersTablesFirst(t *testing.T) {
	db, _ := pgtest.DB(t) // the runtime role: DML only
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, arm Arm) error
	}{
		{"capacity", func(ctx context.Context, arm Arm) error {
			o := DefaultCapacity()
			// One short step, so that a run that does not check first ends soon too.
			o.StartRate, o.MaxRate, o.StepDuration, o.Window = 5, 5, time.Second, time.Second
			o.Courses, o.DrainTimeout = 1, time.Second
			o.DB, o.PeerDB = db, db
			_, err := RunCapacity(ctx, o, arm)
			return err
		}},
		{"compare", func(ctx context.Context, arm Arm) error {
			o := Options{
				Scenario: Scenario{StartRate: 5, Stages: []Stage{{Duration: time.Second, Target: 5}}, Sleep: time.Second, MaxVUs: 10},
				Courses:  1, Seats: 10, Students: 10, DrainTimeout: time.Second, DB: db, PeerDB: db,
			}
			_, err := Compare(ctx, o, arm)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := tc.run(ctx, Arm{Name: "claimflow", URL: srv.URL, Schema: ClaimflowSchema})
			if err == nil || !strings.Contains(err.Error(), "MIGRATE_DATABASE_URL") || !strings.Contains(err.Error(), "before either arm") {
				t.Fatalf("as the runtime role: %v; want the peer's tables refused before either arm, naming MIGRATE_DATABASE_URL", err)
			}
			if n := hits.Load(); n != 0 {
				t.Fatalf("the claimflow arm sent %d requests before the peer's tables were checked", n)
			}
		})
	}
}
