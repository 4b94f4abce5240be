package workflows_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// sendDeskBatch sends batch to the desk after delay, as the API does.
func sendDeskBatch(env *testsuite.TestWorkflowEnvironment, b workflows.DeskBatch, delay time.Duration) *batchDecisionCall {
	c := &batchDecisionCall{}
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(workflows.UpdateDeskBatch, b.BatchID, &testsuite.TestUpdateCallback{
			OnAccept: func() { c.mu.Lock(); c.accepted = true; c.mu.Unlock() },
			OnReject: func(err error) { c.mu.Lock(); c.rejected = err; c.mu.Unlock() },
			OnComplete: func(v any, err error) {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.completed, c.err = true, err
				if err == nil {
					d, ok := v.([]workflows.Decision)
					if !ok {
						c.err = fmt.Errorf("update returned %T", v)
					}
					c.value = d
				}
			},
		}, b)
	}, delay)
	return c
}

func deskBatch(id string, claims ...workflows.EnrollmentInput) workflows.DeskBatch {
	return workflows.DeskBatch{BatchID: id, Claims: claims, CollectedAt: testStart}
}

func TestEnrollmentDesk(t *testing.T) {
	t.Run("decides each batch on the fast path and continues as new after its batches", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 3, 1)
		env, _ := newBatchEnv(t, f)
		first := sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")), 0)
		// The course has two seats left: the third claim is refused.
		second := sendDeskBatch(env, deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", noCourse, "stu-4")), time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{Desk: 0, BatchesPerRun: 2})

		require.True(t, env.IsWorkflowCompleted())
		var can *workflow.ContinueAsNewError
		require.True(t, errors.As(env.GetWorkflowError(), &can), "after 2 batches the desk continues as new, got %v", env.GetWorkflowError())
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1"), confirmedDecision("enr-2")}, first.result(t))
		got := second.result(t)
		require.Len(t, got, 2)
		assert.Equal(t, workflows.StatusRefused, got[0].Status, "no seat left")
		assert.Equal(t, workflows.RefusalCourseFull, got[0].Refusal)
		assert.Equal(t, workflows.StatusRefused, got[1].Status, "no such course")
		assert.Equal(t, workflows.RefusalCourseNotFound, got[1].Refusal)
		assert.Equal(t, 3, f.seatsTaken(courseID), "two seats taken, none twice")
		require.Len(t, f.publishedMessages(), 2, "one event per confirmed enrollment")
		for _, m := range f.publishedMessages() {
			assert.True(t, m.Event.OccurredAt.Equal(testStart), "events carry the batch's CollectedAt, not the desk's start")
		}
		assert.Empty(t, f.confirmBatchCalls(), "the desk confirms as it publishes")
		calls := f.reserveSeatsCalls()
		require.Len(t, calls, 2, "one reservation a batch")
		assert.Equal(t, testWorkflowID, calls[0].WorkflowID, "the rows name the desk's run")
		for i, c := range calls[0].Claims {
			assert.Equal(t, "b-1", c.BatchID, "claim %d names its batch", i)
			assert.True(t, c.OccurredAt.Equal(testStart), "claim %d carries its batch's time", i)
		}
		fast := f.fastPublishAttempts()
		require.Len(t, fast, 1, "the second batch granted nothing: nothing to publish")
		assert.True(t, fast[0].In.FailFast && fast[0].In.Confirm && fast[0].In.PublishedKnown,
			"one attempt, confirming as it publishes, told what is out")
	})

	t.Run("a failed fast path answers reserved and hands the batch to a run of its own", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 2)
		f.failBatch = 1 // the fast path does not send; the batch run's first durable attempt fails, its retry sends
		env, _ := newBatchEnv(t, f)
		var children []string
		var handed workflows.EnrollmentBatchInput
		env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
			children = append(children, info.WorkflowExecution.ID)
			assert.NoError(t, args.Get(&handed))
		})
		pairGranted := pairClaims()[:2]
		pairDecisions := []workflows.Decision{reserved("enr-2"), reserved("enr-1"),
			refusal("enr-3", workflows.RefusalCourseNotFound)}
		call := sendDeskBatch(env, deskBatch("b-1", pairClaims()...), 0)

		// The desk stays until the batch run is done: the test environment
		// ends a closed parent's children, which the server does not
		// (ParentClosePolicy abandon).
		env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{DiscloseWithin: time.Hour})

		require.True(t, env.IsWorkflowCompleted())
		got := call.result(t)
		for i := range got {
			got[i].Message = ""
		}
		assert.Equal(t, pairDecisions, got, "reserved at once, the refusal as it is")
		assert.Equal(t, []string{workflows.EnrollmentBatchWorkflowID("b-1")}, children, "the batch's run publishes")
		assert.Equal(t, "b-1", handed.BatchID)
		assert.Equal(t, idsOf(pairGranted), idsOf(handed.Claims), "the reserved claims alone")
		for _, c := range handed.Claims {
			assert.True(t, c.OccurredAt.Equal(testStart) && c.BatchID == "b-1", "%s carries its batch and time", c.EnrollmentID)
		}
		for _, c := range pairGranted {
			assert.Equal(t, workflows.StatusConfirmed, f.enrollment(c.EnrollmentID).Status, "the batch run published and confirmed")
		}
		assert.Len(t, f.publishedMessages(), len(pairGranted), "each event once")
		assert.Equal(t, 4, f.seatsTaken(courseID), "two seats taken, by the desk alone")
	})

	// The test environment hands each update to a workflow task of its
	// own; TestIntegration's desk rushes show batches merged on a real
	// server (deskMerged).
	t.Run("claims of later batches meet the earlier ones, and each event carries its batch's time", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, _ := newBatchEnv(t, f)
		second := testStart.Add(time.Second)
		b1 := deskBatch("b-1", claim("enr-1", courseID, "stu-1"))
		b2 := deskBatch("b-2", claim("enr-2", courseID, "stu-2"), claim("enr-3", courseID, "stu-1"))
		b2.CollectedAt = second
		var first, other *batchDecisionCall
		env.RegisterDelayedCallback(func() {
			first = sendDeskBatch(env, b1, 0)
			other = sendDeskBatch(env, b2, 0)
		}, time.Millisecond)
		env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{})

		require.True(t, env.IsWorkflowCompleted())
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, first.result(t))
		got := other.result(t)
		require.Len(t, got, 2)
		assert.Equal(t, confirmedDecision("enr-2"), got[0])
		assert.Equal(t, workflows.StatusRefused, got[1].Status, "stu-1 holds a seat from the other batch")
		assert.Equal(t, workflows.RefusalAlreadyEnrolled, got[1].Refusal)
		at := map[string]time.Time{}
		for _, m := range f.publishedMessages() {
			at[m.Event.Data["enrollment_id"].(string)] = m.Event.OccurredAt
		}
		assert.True(t, at["enr-1"].Equal(testStart), "enr-1's event carries its batch's time, got %v", at["enr-1"])
		assert.True(t, at["enr-2"].Equal(second), "enr-2's event carries its batch's time, got %v", at["enr-2"])
	})

	t.Run("a cancel closes the desk after the batches it holds", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, _ := newBatchEnv(t, f)
		call := sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), 0)
		env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{})

		require.True(t, env.IsWorkflowCompleted())
		assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()), "got %v", env.GetWorkflowError())
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, call.result(t))
	})

	t.Run("an empty batch is rejected", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, _ := newBatchEnv(t, f)
		call := sendDeskBatch(env, workflows.DeskBatch{BatchID: "b-0", CollectedAt: testStart}, 0)
		env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{})

		call.mu.Lock()
		defer call.mu.Unlock()
		assert.Error(t, call.rejected)
		assert.Zero(t, f.callCount(workflows.ReserveSeats.Name))
	})
}

func TestEnrollmentDeskTellsWhatItDecided(t *testing.T) {
	t.Run("the closing run lists the students it confirmed and refused", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 3, 1)
		env, upserts := newBatchEnv(t, f)
		sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")), 0)
		sendDeskBatch(env, deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", noCourse, "stu-4")), time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{BatchesPerRun: 2})

		var can *workflow.ContinueAsNewError
		require.True(t, errors.As(env.GetWorkflowError(), &can), "got %v", env.GetWorkflowError())
		all := upserts.all()
		require.Len(t, all, 1, "one upsert, in the closing task")
		assert.Equal(t, outcome{ClaimStatus: "confirmed", StudentIDs: []string{"stu-1", "stu-2"}, CourseIDs: []string{courseID},
			Refused: []string{"stu-3", "stu-4"}}, outcomeOf(all[0]))
	})

	t.Run("a desk that only refused says refused; one that reserved only says handed_off", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			failBatch int
			claims    []workflows.EnrollmentInput
			want      outcome
		}{
			{"refused", 0, []workflows.EnrollmentInput{claim("enr-1", noCourse, "stu-1")},
				outcome{ClaimStatus: "refused", Refused: []string{"stu-1"}}},
			{"handed off", 1, []workflows.EnrollmentInput{claim("enr-1", courseID, "stu-1")},
				outcome{ClaimStatus: "handed_off"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = tc.failBatch
				env, upserts := newBatchEnv(t, f)
				sendDeskBatch(env, deskBatch("b-1", tc.claims...), 0)
				// Closed by a cancel once a handed-off batch's run is done
				// (the test environment ends a closed parent's children),
				// so the desk's upsert is the last.
				env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)

				env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{DiscloseWithin: time.Hour})

				assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()), "got %v", env.GetWorkflowError())
				all := upserts.all()
				require.NotEmpty(t, all)
				assert.Equal(t, tc.want, outcomeOf(all[len(all)-1]))
			})
		}
	})

	t.Run("a run closes DiscloseWithin after its first decision", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, upserts := newBatchEnv(t, f)
		sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), time.Minute)
		late := sendDeskBatch(env, deskBatch("b-2", claim("enr-2", courseID, "stu-2")), time.Minute+6*time.Second)
		began := env.Now()

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{DiscloseWithin: 5 * time.Second})

		var can *workflow.ContinueAsNewError
		require.True(t, errors.As(env.GetWorkflowError(), &can), "got %v", env.GetWorkflowError())
		took := env.Now().Sub(began)
		assert.True(t, took >= time.Minute+5*time.Second && took < time.Minute+6*time.Second,
			"idle for a minute, then closed 5 s after its first decision; closed after %s", took)
		late.mu.Lock()
		assert.False(t, late.accepted, "the batch after the close goes to the next run")
		late.mu.Unlock()
		all := upserts.all()
		require.Len(t, all, 1)
		assert.Equal(t, []string{"stu-1"}, outcomeOf(all[0]).StudentIDs)
	})

	t.Run("a batch that might not fit is turned away and the run closes; a run closes when two of its largest might not", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			// batches sent one second apart
			batches []workflows.DeskBatch
			// wantDecided: how many batches the run decided; the next one
			// is turned away DeskFull by the handler, the rest by the
			// validator while the run closes.
			wantDecided  int
			wantStudents []string
		}{
			{
				// Each student is 8 bytes ("stu-1" quoted, a comma), the
				// course 8; the budget is 50. 16 + 40 bytes do not fit.
				name: "too large: turned away",
				batches: []workflows.DeskBatch{
					deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")),
					deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", courseID, "stu-4"),
						claim("enr-5", courseID, "stu-5"), claim("enr-6", courseID, "stu-6"), claim("enr-7", courseID, "stu-7")),
					deskBatch("b-3", claim("enr-8", courseID, "stu-8")),
				},
				wantDecided: 1, wantStudents: []string{"stu-1", "stu-2"},
			},
			{
				// The largest batch decided adds 16 bytes: after 16 + 8
				// the list leaves less than 2 × 16 of 50, and the run
				// closes without turning anything away.
				name: "nearly full: closes",
				batches: []workflows.DeskBatch{
					deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")),
					deskBatch("b-2", claim("enr-3", courseID, "stu-3")),
					deskBatch("b-3", claim("enr-4", courseID, "stu-4")),
				},
				wantDecided: 2, wantStudents: []string{"stu-1", "stu-2", "stu-3"},
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				env, upserts := newBatchEnv(t, f)
				var calls []*batchDecisionCall
				for i, b := range tc.batches {
					calls = append(calls, sendDeskBatch(env, b, time.Duration(i)*time.Second))
				}
				began := env.Now()

				env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{AttrBytes: 50, DiscloseWithin: time.Hour})

				assert.Less(t, env.Now().Sub(began), time.Minute, "closed when full, not by the hour's timer")
				var can *workflow.ContinueAsNewError
				require.True(t, errors.As(env.GetWorkflowError(), &can), "got %v", env.GetWorkflowError())
				for i, c := range calls {
					c.mu.Lock()
					var app *temporal.ApplicationError
					switch {
					case i < tc.wantDecided:
						assert.True(t, c.completed && c.err == nil, "batch %d decided (%v)", i, c.err)
					case i == tc.wantDecided && tc.wantDecided == 1:
						if assert.True(t, errors.As(c.err, &app), "batch %d turned away, got %v", i, c.err) {
							assert.Equal(t, workflows.DeskFullErrorType, app.Type())
						}
					default:
						assert.False(t, c.completed && c.err == nil, "batch %d after the close goes to the next run", i)
						if c.rejected != nil && assert.True(t, errors.As(c.rejected, &app)) {
							assert.Equal(t, workflows.DeskFullErrorType, app.Type(), "turned away while the run closes")
						}
					}
					c.mu.Unlock()
				}
				all := upserts.all()
				require.Len(t, all, 1)
				assert.Equal(t, tc.wantStudents, outcomeOf(all[0]).StudentIDs)
				assert.Equal(t, tc.wantDecided, f.callCount(workflows.ReserveSeats.Name), "what was turned away reserved nothing")
			})
		}
	})

	t.Run("a run clears what it continued from its previous run", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, upserts := newBatchEnv(t, f)
		require.NoError(t, env.SetTypedSearchAttributesOnStart(temporal.NewSearchAttributes(
			workflows.SearchClaimStatus.ValueSet("confirmed"), workflows.SearchStudentID.ValueSet([]string{"stu-0"}))))
		sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), 0)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{BatchesPerRun: 1})

		all := upserts.all()
		require.Len(t, all, 2)
		assert.Zero(t, all[0].Size(), "the first upsert unsets every key")
		assert.Equal(t, []string{"stu-1"}, outcomeOf(all[1]).StudentIDs)
	})
}
