package activities

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// TestSettledEnrollmentsAreAnnounced: every way an enrollment leaves
// "reserved" — confirmed alone or in a batch, failed, dead-lettered — is
// announced on store.SettledChannel once it commits, so the API's
// ?wait=confirmed can wait on the notification instead of polling.
// Moves that do not leave "reserved" announce nothing.
func TestSettledEnrollmentsAreAnnounced(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu        sync.Mutex
		heard     = map[string]int{}
		connected = make(chan struct{}, 1)
		done      = make(chan struct{})
	)
	go func() {
		defer close(done)
		store.ListenSettled(ctx, db, func() {
			select {
			case connected <- struct{}{}:
			default:
			}
		}, func(id string) {
			mu.Lock()
			heard[id]++
			mu.Unlock()
		}, func(err error) { t.Logf("listener: %v", err) })
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		t.Fatal("the listener did not connect")
	}

	course := p + "settle"
	addCourse(t, db, course, 20)
	reserve := func(name string) string {
		in := seatInput(p, fmt.Sprintf("%s-%s", course, name), course, name)
		if _, err := reserveSeat(ctx, a, in); err != nil {
			t.Fatal(err)
		}
		return in.EnrollmentID
	}
	confirmed, batch1, batch2, failed, quiet := reserve("one"), reserve("b1"), reserve("b2"), reserve("failed"), reserve("quiet")
	if err := a.MarkConfirmed(ctx, confirmed); err != nil {
		t.Fatal(err)
	}
	if err := a.ConfirmBatch(ctx, []string{batch1, batch2}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseSeat(ctx, workflows.ReleaseSeatInput{EnrollmentID: failed}); err != nil {
		t.Fatal(err)
	}
	// Confirming again, or releasing a confirmed one, moves nothing.
	if err := a.MarkConfirmed(ctx, confirmed); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseSeat(ctx, workflows.ReleaseSeatInput{EnrollmentID: confirmed}); err != nil {
		t.Fatal(err)
	}

	want := map[string]int{confirmed: 1, batch1: 1, batch2: 1, failed: 1}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := len(heard)
		mu.Unlock()
		if got >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a second announcement would come as fast as the first
	mu.Lock()
	defer mu.Unlock()
	for id, n := range want {
		if heard[id] != n {
			t.Errorf("%s announced %d times, want %d", id, heard[id], n)
		}
	}
	for id, n := range heard {
		if _, ok := want[id]; !ok && len(id) > len(p) && id[:len(p)] == p {
			t.Errorf("%s announced %d times, want none", id, n)
		}
	}
	if heard[quiet] != 0 {
		t.Errorf("the still reserved %s was announced", quiet)
	}
}
