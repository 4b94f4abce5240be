package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	historypb "go.temporal.io/api/history/v1"
	workflowpb "go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	temporallog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/worker"
)

// runReplay replays histories against the workflow code in this binary and
// names every run that would break: run it before deploying a change.
func runReplay(ctx context.Context, cfg appconfig.Config, log *slog.Logger, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	workflowID := fs.String("workflow-id", "", "replay the live run(s) with this workflow ID (latest run unless -run-id)")
	runID := fs.String("run-id", "", "with -workflow-id: this run")
	query := fs.String("query", "", `replay every live run matching this list query, e.g. "CourseId='cs101'"`)
	limit := fs.Int("limit", 1000, "with -query: at most this many runs")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: claimflow replay [flags] [history.json ...]")
		fmt.Fprintln(fs.Output(), "history files come from `temporal workflow show -w ID --output json` or `tctl wf show -w ID --output_filename F`")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 && *workflowID == "" && *query == "" {
		fs.Usage()
		return errors.New("nothing to replay: give history files, -workflow-id or -query")
	}
	replayer := sdkworker.NewWorkflowReplayer()
	worker.RegisterWorkflows(replayer)
	logger := temporallog.NewStructuredLogger(log.With("component", "replayer"))

	var failed []string
	report := func(name string, err error) {
		if err != nil {
			failed = append(failed, name)
			fmt.Fprintf(out, "FAIL %s: %v\n", name, err)
			return
		}
		fmt.Fprintf(out, "ok   %s\n", name)
	}
	for _, file := range fs.Args() {
		report(file, replayer.ReplayWorkflowHistoryFromJSONFile(logger, file))
	}
	if *workflowID != "" || *query != "" {
		c, err := services.DialTemporal(ctx, cfg, log, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		runs := []runRef{{*workflowID, *runID}}
		if *query != "" {
			runs, err = listRuns(ctx, c, cfg.Namespace, *query, *limit)
			if err != nil {
				return err
			}
			if *workflowID != "" {
				runs = append(runs, runRef{*workflowID, *runID})
			}
		}
		for _, r := range runs {
			h, err := fetchHistory(ctx, c, r)
			if err == nil {
				err = replayer.ReplayWorkflowHistory(logger, h)
			}
			report(r.String(), err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d run(s) would break with this build: %v", len(failed), failed)
	}
	return nil
}

type runRef struct{ WorkflowID, RunID string }

func (r runRef) String() string {
	if r.RunID == "" {
		return r.WorkflowID
	}
	return r.WorkflowID + "/" + r.RunID
}

func listRuns(ctx context.Context, c client.Client, namespace, query string, limit int) ([]runRef, error) {
	var runs []runRef
	var token []byte
	for len(runs) < limit {
		resp, err := c.ListWorkflow(ctx, &workflowpb.ListWorkflowExecutionsRequest{
			Namespace: namespace, Query: query, NextPageToken: token, PageSize: int32(min(limit, 1000)),
		})
		if err != nil {
			return nil, fmt.Errorf("list runs matching %q: %w", query, err)
		}
		for _, e := range resp.Executions {
			runs = append(runs, runRef{e.Execution.WorkflowId, e.Execution.RunId})
		}
		token = resp.NextPageToken
		if len(token) == 0 {
			break
		}
	}
	return runs[:min(len(runs), limit)], nil
}

func fetchHistory(ctx context.Context, c client.Client, r runRef) (*historypb.History, error) {
	it := c.GetWorkflowHistory(ctx, r.WorkflowID, r.RunID, false, 0)
	h := &historypb.History{}
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("fetch history of %s: %w", r, err)
		}
		h.Events = append(h.Events, e)
	}
	return h, nil
}
