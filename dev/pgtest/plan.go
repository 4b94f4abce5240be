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
