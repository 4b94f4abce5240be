package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

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

// ClaimList lists each student and course once, in first-seen order, and
// measures what a batch may still take within a byte budget.
func TestClaimList(t *testing.T) {
	l := workflows.ClaimListOf([]workflows.EnrollmentInput{
		claim("enr-1", courseID, "stu-1"), claim("enr-2", course2, "stu-1"), claim("enr-3", courseID, "stu-2"),
	})
	assert.Equal(t, 2, l.Len())
	// "stu-1" and "stu-2" quoted with a comma: 8 bytes each; the courses 8 each.
	assert.Equal(t, 16, l.Bytes())
	assert.True(t, l.Fits(claim("enr-4", courseID, "stu-1"), 16), "a student and course already listed cost nothing")
	assert.False(t, l.Fits(claim("enr-5", courseID, "stu-3"), 16), "a new student passes the budget")
	assert.True(t, l.Fits(claim("enr-5", courseID, "stu-3"), 24))
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
