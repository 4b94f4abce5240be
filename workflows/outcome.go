package workflows

import (
	"slices"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// What a closed run tells an operator's visibility query. A run upserts its
// final search attributes in the workflow task that closes it, so the
// server's visibility task for the upsert finds the run closed and skips it
// (history's processUpsertExecution returns early for a closed run): the
// close record carries the final values, and the run costs no visibility
// write beyond its start and its close.

// outcomeChangeID versions the final upserts of EnrollmentBatch and
// DeliverEvent: runs recorded before them replay without the command.
const outcomeChangeID = "final-search-attributes"

// outcomeVersion is the version of runs that upsert their final search
// attributes; workflow.DefaultVersion for runs recorded before.
func outcomeVersion(ctx workflow.Context) workflow.Version {
	return workflow.GetVersion(ctx, outcomeChangeID, workflow.DefaultVersion, 1)
}

// batchOutcome is what a closed batch run's search attributes say. The
// rule, for every claimflow run: each student in StudentId and each course
// in CourseId has a claim in the run that ended as ClaimStatus says. So
// `StudentId='s-1' AND ClaimStatus='confirmed'` finds exactly the runs,
// single or batch, that confirmed a claim of s-1.
//
// A batch's granted claims share one fate (confirmed together, handed off
// together, or released together when the run is cancelled), so a batch
// that refused some claims and granted others keeps in StudentId and
// CourseId only the students and courses of the granted claims, with
// ClaimStatus their fate, and lists the refused students in
// RefusedStudentIds. A batch that granted nothing keeps every student and
// course with ClaimStatus refused. Both lists are subsets of the StudentId
// list the run started with, so neither can exceed the per-value size
// limit that list already met.
type batchOutcome struct {
	Status   EnrollmentStatus
	Students []string // StudentId; nil when unchanged
	Courses  []string // CourseId; nil when unchanged
	Refused  []string // RefusedStudentIds; nil when none
}

// outcomeOfBatch derives the outcome from the claims, the decision every
// claim got (in claim order) and the batch's final status.
func outcomeOfBatch(claims []EnrollmentInput, decisions []Decision, status EnrollmentStatus) batchOutcome {
	fate := StatusFailed // a run that ends mid-way (a fault) did not finish its claims
	switch status {
	case StatusConfirmed, StatusRefused, StatusFailed:
		fate = status
	case StatusDeadLettered:
		// The enrollments' dead letters are in their own runs, which an
		// operator signals; the closed batch is not waiting for anyone.
		fate = StatusHandedOff
	}
	var o batchOutcome
	var students, courses []string
	waitlisted := 0
	for i, c := range claims {
		// A waitlisted claim got no seat in this run either; the run that
		// promotes it decides it later.
		if i < len(decisions) && (decisions[i].Status == StatusRefused || decisions[i].Status == StatusWaitlisted) {
			o.Refused = appendNew(o.Refused, c.StudentID)
			if decisions[i].Status == StatusWaitlisted {
				waitlisted++
			}
			continue
		}
		students = appendNew(students, c.StudentID)
		courses = appendNew(courses, c.CourseID)
	}
	switch {
	case len(students) == 0 && waitlisted == len(claims):
		o.Status = StatusWaitlisted
	case len(students) == 0:
		o.Status = StatusRefused
	case len(o.Refused) == 0:
		o.Status = fate
	default:
		o.Status, o.Students, o.Courses = fate, students, courses
	}
	return o
}

func appendNew(list []string, v string) []string {
	if slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}

// upsert sets the outcome in one command.
func (o batchOutcome) upsert(ctx workflow.Context) {
	updates := []temporal.SearchAttributeUpdate{SearchClaimStatus.ValueSet(string(o.Status))}
	if o.Students != nil {
		updates = append(updates, SearchStudentID.ValueSet(o.Students), SearchCourseID.ValueSet(o.Courses))
	}
	if o.Refused != nil {
		updates = append(updates, SearchRefusedStudentIDs.ValueSet(o.Refused))
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, updates...); err != nil {
		workflow.GetLogger(ctx).Warn("upsert the batch's outcome failed", "error", err)
	}
}
