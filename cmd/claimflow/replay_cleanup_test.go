package main

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/worker"
)

// replayRunsLimit bounds how many runs one replayRunsOf call replays; a
// quick bench leaves a few thousand at most, and each replay takes
// milliseconds.
const replayRunsLimit = 20000

// replayRunsOf replays every closed run on the stack's Temporal server that
// matches query ("" for every closed run) against the workflow code of this
// build, exactly as `claimflow replay -query` does (runReplay: listRuns, the
// production worker's registrations, the SDK replayer), and fails the test
// for each run that would not replay. Register it in a test's cleanup
// before its stack stops (t.Cleanup is last in, first out), so that a
// non-deterministic change to a workflow fails CI even when no fixture in
// workflows/testdata covers the path the test drove. It returns how many
// runs replayed.
//
// Runs still open are left out: their history ends in the middle of a
// workflow, and visibility may list a run that has just closed as running a
// little longer. A stack whose Temporal server is already stopped (a test
// that restarts the stack on the same data directory) is skipped with a log
// line: the second stack's cleanup replays the same runs.
func replayRunsOf(t *testing.T, s *stack, query string) int {
	t.Helper()
	if s.Temporal == nil {
		t.Logf("replay runs: the stack's Temporal server is stopped; nothing replayed here")
		return 0
	}
	// Only claimflow's own workflow types: the bench's floor runs an empty
	// workflow of its own on the same server, which this build does not
	// register.
	q := "ExecutionStatus != 'Running' AND WorkflowType IN (" + claimflowWorkflowTypes() + ")"
	if query != "" {
		q = "(" + query + ") AND " + q
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The replayer logs the panic of a non-deterministic run at error level;
	// it is in the test's output only when the test fails.
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	var out bytes.Buffer
	began := time.Now()
	err := runReplay(ctx, s.Config, log, []string{"-query", q, "-limit", strconv.Itoa(replayRunsLimit)}, &out)
	ok, failed := 0, []string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "ok "):
			ok++
		case strings.HasPrefix(line, "FAIL "):
			failed = append(failed, line)
		}
	}
	if err != nil {
		t.Errorf("replaying the closed runs matching %q against this build: %v\n%s", q, err, strings.Join(failed, "\n"))
		return ok
	}
	if ok == replayRunsLimit {
		t.Logf("replay runs: stopped at the limit of %d runs", replayRunsLimit)
	}
	t.Logf("replayed %d closed runs matching %q against this build in %s", ok, q, time.Since(began).Round(time.Millisecond))
	return ok
}

// claimflowWorkflowTypes lists, quoted for a visibility query, every
// workflow type the production worker registers.
func claimflowWorkflowTypes() string {
	var r typeRecorder
	worker.RegisterWorkflows(&r)
	return "'" + strings.Join(r.names, "', '") + "'"
}

type typeRecorder struct{ names []string }

func (r *typeRecorder) RegisterWorkflow(w any) {
	name := runtime.FuncForPC(reflect.ValueOf(w).Pointer()).Name()
	r.names = append(r.names, name[strings.LastIndex(name, ".")+1:])
}
