package workflows_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"

	"github.com/claimflow/claimflow/workflows"
)

// outcome is what a closed run's final upsert says.
type outcome struct {
	ClaimStatus string
	StudentIDs  []string // StudentId; nil when not upserted
	CourseIDs   []string // CourseId; nil when not upserted
	Refused     []string // RefusedStudentIds; nil when not upserted
}

func outcomeOf(sa temporal.SearchAttributes) outcome {
	var o outcome
	o.ClaimStatus, _ = sa.GetKeyword(workflows.SearchClaimStatus)
	o.StudentIDs, _ = sa.GetKeywordList(workflows.SearchStudentID)
	o.CourseIDs, _ = sa.GetKeywordList(workflows.SearchCourseID)
	o.Refused, _ = sa.GetKeywordList(workflows.SearchRefusedStudentIDs)
	return o
}

// A closed batch run's search attributes say what became of each claim:
// every student in StudentId and course in CourseId has a claim that ended
// as ClaimStatus says, and RefusedStudentIds lists the refused students.
// So `StudentId='s' AND ClaimStatus='confirmed'` never finds a batch that
// refused s (and confirmed nothing else of s).
func TestEnrollmentBatchOutcomeSearchAttributes(t *testing.T) {
	mixed := []workflows.EnrollmentInput{
		claim("enr-a", courseID, "stu-1"),
		claim("enr-b", course2, "stu-1"),
		claim("enr-c", courseID, "stu-2"),
		claim("enr-d", courseID, "stu-3"), // course full
		claim("enr-e", course2, "stu-1"),  // stu-1 already holds ma201 (enr-b): refused, and confirmed above
		claim("enr-h", course2, "stu-5"),
		claim("enr-g", noCourse, "stu-4"), // no such course
	}
	allIn := []workflows.EnrollmentInput{claim("enr-1", courseID, "stu-1"), claim("enr-2", course2, "stu-2")}
	child := func(c workflows.EnrollmentInput) string {
		return workflows.EnrollmentWorkflowID(c.CourseID, c.StudentID) + ":" + c.EnrollmentID
	}
	tests := []struct {
		name        string
		fake        func() *batchFake
		claims      []workflows.EnrollmentInput
		answerFirst bool
		cancelAt    time.Duration
		act         func(*testing.T, *batchRun)
		want        outcome
	}{
		{
			name: "fast path, mixed: the granted students and courses stay, the refused move to RefusedStudentIds",
			fake: func() *batchFake {
				return newBatchFake().withCourse(courseID, 2, 0).withCourse(course2, 10, 0)
			},
			claims: mixed,
			want: outcome{ClaimStatus: "confirmed", StudentIDs: []string{"stu-1", "stu-2", "stu-5"},
				CourseIDs: []string{courseID, course2}, Refused: []string{"stu-3", "stu-1", "stu-4"}},
		},
		{
			name:   "fast path, all confirmed: only ClaimStatus changes",
			fake:   func() *batchFake { return newBatchFake().withCourse(courseID, 10, 0).withCourse(course2, 10, 0) },
			claims: allIn,
			want:   outcome{ClaimStatus: "confirmed"},
		},
		{
			name:   "all refused: every student stays, and is listed as refused",
			fake:   func() *batchFake { return newBatchFake().withCourse(courseID, 1, 1) },
			claims: []workflows.EnrollmentInput{claim("enr-1", courseID, "stu-1"), claim("enr-2", noCourse, "stu-2")},
			want:   outcome{ClaimStatus: "refused", Refused: []string{"stu-1", "stu-2"}},
		},
		{
			name: "durable path (fast path failed, publish retried): reserved, then confirmed",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = 2
				return f
			},
			claims: pairClaims(),
			want: outcome{ClaimStatus: "confirmed", StudentIDs: []string{"stu-2", "stu-1"},
				CourseIDs: []string{courseID}, Refused: []string{"stu-3"}},
		},
		{
			name: "a batch from before the fast path (answer first) ends confirmed too",
			fake: func() *batchFake {
				return newBatchFake().withCourse(courseID, 10, 0).withCourse(course2, 10, 0)
			},
			claims:      allIn,
			answerFirst: true,
			want:        outcome{ClaimStatus: "confirmed"},
		},
		{
			name: "hand-off: the batch ends handed_off; the children carry the enrollments on",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = -1
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			claims: pairClaims(),
			act: func(t *testing.T, r *batchRun) {
				r.env.RegisterDelayedCallback(func() {
					r.fake.failPublishing(workflows.EventEnrollmentConfirmed, 0)
					for _, c := range pairClaims()[:2] {
						assert.NoError(t, r.env.SignalWorkflowByID(child(c), workflows.SignalDeadLetter,
							workflows.DeadLetterDecision{Action: workflows.ActionRetry}))
					}
				}, time.Minute)
			},
			want: outcome{ClaimStatus: "handed_off", StudentIDs: []string{"stu-2", "stu-1"},
				CourseIDs: []string{courseID}, Refused: []string{"stu-3"}},
		},
		{
			name: "cancelled while the publish retries: the seats are given back, the batch ends failed",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = -1
				return f
			},
			claims:   pairClaims(),
			cancelAt: 1500 * time.Millisecond,
			want: outcome{ClaimStatus: "failed", StudentIDs: []string{"stu-2", "stu-1"},
				CourseIDs: []string{courseID}, Refused: []string{"stu-3"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, statuses := newBatchEnv(t, f)
			r := &batchRun{t: t, env: env, fake: f, claims: tc.claims}
			r.recordChildren()
			r.decisions = sendBatchDecision(env, "update-1", 0)
			if tc.cancelAt > 0 {
				env.RegisterDelayedCallback(env.CancelWorkflow, tc.cancelAt)
			}
			if tc.act != nil {
				tc.act(t, r)
			}
			env.ExecuteWorkflow(workflows.EnrollmentBatch, workflows.EnrollmentBatchInput{BatchID: batchID, Claims: tc.claims,
				ConfirmBeforeAnswer: !tc.answerFirst})
			require.True(t, env.IsWorkflowCompleted())

			// The batch upserts once, as it closes; its children (the
			// hand-off) upsert their own statuses, never with StudentId.
			var batch []outcome
			for _, sa := range statuses.all() {
				o := outcomeOf(sa)
				if o.ClaimStatus == "handed_off" || len(r.startedChildren()) == 0 {
					batch = append(batch, o)
				}
			}
			require.Len(t, batch, 1, "one upsert of the batch's outcome: %+v", batch)
			assert.Equal(t, tc.want, batch[0])
			if tc.want.ClaimStatus == "handed_off" {
				var children []string
				for _, sa := range statuses.all() {
					if o := outcomeOf(sa); o.ClaimStatus != "handed_off" {
						children = append(children, o.ClaimStatus)
					}
				}
				assert.ElementsMatch(t, []string{"reserved", "reserved", "dead_lettered", "dead_lettered",
					"reserved", "reserved", "confirmed", "confirmed"}, children,
					"each child: reserved, dead_lettered, reserved again on retry, confirmed")
			}
		})
	}
}

// A delivery that never parked gets its ClaimStatus as it closes.
func TestDeliverEventOutcomeWithoutParking(t *testing.T) {
	t.Run("delivered", func(t *testing.T) {
		f := &fakeSink{}
		env, claims := newDeliverEnv(t, f)
		env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		assert.Equal(t, []string{"delivered"}, claims.get())
	})
	t.Run("cancelled while retrying", func(t *testing.T) {
		f := &fakeSink{fail: -1}
		env, claims := newDeliverEnv(t, f)
		env.RegisterDelayedCallback(env.CancelWorkflow, 2*time.Second)
		env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
		require.True(t, env.IsWorkflowCompleted())
		require.Error(t, env.GetWorkflowError())
		assert.Equal(t, []string{"discarded"}, claims.get())
	})
}

// Histories recorded on the dev server (testdata/outcome/README.md): the
// before_* runs predate the final upserts and replay without them (the
// GetVersion marker is absent); the after_* runs carry them.
func TestReplayAcrossTheOutcomeUpsert(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "outcome", "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 8)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(workflows.EnrollmentBatch)
			r.RegisterWorkflow(workflows.Enrollment)
			r.RegisterWorkflow(workflows.DeliverEvent)
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(quiet, file))
		})
	}
}

func TestBatchStartSummary(t *testing.T) {
	summary, details := workflows.BatchStartSummary([]workflows.EnrollmentInput{
		claim("enr-1", "ma201", "stu-1"), claim("enr-2", "cs101", "stu-1"), claim("enr-3", "cs101", "stu-2"),
	})
	assert.Equal(t, "enrollment batch: 3 claims, 2 students, 2 courses", summary)
	assert.Contains(t, details, "| cs101 | 2 |\n| ma201 | 1 |\n")
	assert.NotContains(t, summary, "\n", "a summary is one line")
}
