package workflows_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/workflows"
)

// outcome is what a closed run's final upsert of its search attributes
// says (visibility.go).
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
