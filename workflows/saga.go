package workflows

import (
	"errors"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// saga is the compensation kernel every claimflow saga uses. A step's
// compensation is registered before the step runs, so a step that took
// effect but reported failure (a commit whose answer was lost) is still
// undone; compensations run last-in first-out on a disconnected context, so
// they also complete after the run was cancelled.
type saga struct {
	compensations []func(workflow.Context) error
}

// add registers the compensation of the step about to run.
func (s *saga) add(c func(workflow.Context) error) {
	s.compensations = append(s.compensations, c)
}

// pending says whether anything would be compensated.
func (s *saga) pending() bool {
	return len(s.compensations) > 0
}

// forget drops every registered compensation: either the step was refused
// and took nothing, or the saga passed its point of no return (the event is
// out, the vendor is paid) and nothing may be undone any more.
func (s *saga) forget() {
	s.compensations = nil
}

// compensate runs the compensations last-in first-out on a disconnected
// context and forgets them. It runs every one even when an earlier one
// failed, so one stuck compensation does not keep the others from running.
func (s *saga) compensate(ctx workflow.Context) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var errs []error
	for i := len(s.compensations) - 1; i >= 0; i-- {
		if err := s.compensations[i](dctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.forget()
	return errors.Join(errs...)
}

// unwindIfCancelled is deferred by a saga's run with a pointer to the run's
// error. When an operator cancelled the run (`temporal workflow cancel`)
// while compensations are pending, undo runs on a disconnected context, since
// the run's own context is already cancelled, and its error joins the run's.
// undo is the saga's own way of failing: at least compensate, often also
// tell downstream.
func (s *saga) unwindIfCancelled(ctx workflow.Context, errp *error, undo func(workflow.Context) error) {
	if !temporal.IsCanceledError(*errp) || !s.pending() {
		return
	}
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if err := undo(dctx); err != nil {
		*errp = errors.Join(*errp, err)
	}
}
