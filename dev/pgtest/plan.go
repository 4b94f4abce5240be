package pgtest

import (
	"encoding/json"
	"fmt"
)

// PlanNode is one node of a plan as EXPLAIN (FORMAT JSON) prints it, with
// the fields the plan tests read.
type PlanNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Relation  string     `json:"Relation Name"`
	Plans     []PlanNode `json:"Plans"`
	// With ANALYZE: rows per loop, loops, and the rows a filter or a
	// join filter removed, per loop.
	ActualRows        float64 `json:"Actual Rows"`
	ActualLoops       float64 `json:"Actual Loops"`
	RemovedFilter     float64 `json:"Rows Removed by Filter"`
	RemovedJoinFilter float64 `json:"Rows Removed by Join Filter"`
}

// RowsVisited is, with ANALYZE, the rows the node produced or a filter
// removed, over all its loops: the work it did, in rows.
func (n PlanNode) RowsVisited() float64 {
	return (n.ActualRows + n.RemovedFilter + n.RemovedJoinFilter) * n.ActualLoops
}

// ParsePlan reads the output of EXPLAIN (FORMAT JSON) of one statement.
func ParsePlan(raw []byte) (PlanNode, error) {
	var plan []struct{ Plan PlanNode }
	if err := json.Unmarshal(raw, &plan); err != nil {
		return PlanNode{}, err
	}
	if len(plan) != 1 {
		return PlanNode{}, fmt.Errorf("%d plans, want 1", len(plan))
	}
	return plan[0].Plan, nil
}

// Walk calls f on n and every node below it, parents first.
func (n PlanNode) Walk(f func(PlanNode)) {
	f(n)
	for _, c := range n.Plans {
		c.Walk(f)
	}
}
