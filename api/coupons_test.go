package api

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

func TestIssueGateBoundsRunsPerType(t *testing.T) {
	var g runGate
	r1, _ := g.tryEnter("t", 2)
	r2, _ := g.tryEnter("t", 2)
	if r1 == nil || r2 == nil {
		t.Fatal("two runs under a limit of 2 must be admitted")
	}
	r3, wait := g.tryEnter("t", 2)
	if r3 != nil || wait == nil {
		t.Fatal("a third run over the limit must wait")
	}
	if other, _ := g.tryEnter("u", 2); other == nil {
		t.Fatal("another type has its own count")
	} else {
		other()
	}
	select {
	case <-wait:
		t.Fatal("woken before a run ended")
	default:
	}
	r1()
	select {
	case <-wait:
	case <-time.After(time.Second):
		t.Fatal("not woken when a run ended")
	}
	r4, _ := g.tryEnter("t", 2)
	if r4 == nil {
		t.Fatal("a slot freed by an ended run must be taken")
	}
	if forced := g.enter("t"); forced == nil {
		t.Fatal("enter always admits")
	} else {
		forced()
	}
	r2()
	r4()
	if len(g.types) != 0 {
		t.Fatalf("types without runs must be forgotten: %v", g.types)
	}
	if r, _ := g.tryEnter("t", 0); r != nil {
		t.Fatal("a limit of 0 (no stock left) admits nothing")
	}
}

func TestRunGateEnterAloneTakesTurns(t *testing.T) {
	var g runGate
	first, err := g.enterAlone(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			release, err := g.enterAlone(context.Background(), "k")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			release()
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := g.enterAlone(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting behind a run that does not end: %v, want the context's error", err)
	}
	first()
	wg.Wait()
	if most.Load() != 1 {
		t.Fatalf("%d requests were inside at once, want 1", most.Load())
	}
	if len(g.types) != 0 {
		t.Fatalf("keys without runs must be forgotten: %v", g.types)
	}
}

func TestSettledUse(t *testing.T) {
	useID := "u-1"
	tests := []struct {
		name    string
		status  string
		user    string
		settled bool
		refusal workflows.Refusal
	}{
		{"issued goes to a run", "issued", "owner", false, ""},
		{"using goes to a run", "using", "owner", false, ""},
		{"used, owner", "used", "owner", true, workflows.RefusalAlreadyUsed},
		{"used, someone else", "used", "other", true, workflows.RefusalNotOwner},
		{"revoked, owner", "revoked", "owner", true, workflows.RefusalCouponRevoked},
		{"revoked, someone else", "revoked", "other", true, workflows.RefusalNotOwner},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, settled := settledUse(coupon{ID: "c", UserID: "owner", Status: tt.status, UseID: &useID}, tt.user)
			if settled != tt.settled || d.Refusal != tt.refusal {
				t.Fatalf("settled=%v refusal=%q, want %v %q", settled, d.Refusal, tt.settled, tt.refusal)
			}
			if settled && (d.Status != workflows.CouponRefused || d.Message == "") {
				t.Fatalf("a settled use is a refusal with a message: %+v", d)
			}
		})
	}
}
