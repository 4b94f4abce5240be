package api

import (
	"testing"
	"time"
)

func TestIssueGateBoundsRunsPerType(t *testing.T) {
	var g issueGate
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
