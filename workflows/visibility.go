package workflows

import (
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// What a run tells an operator's visibility query about the enrollment
// claims it holds, and how its lists stay within the server's size limit
// of a search attribute value (frontend.searchAttributesSizeOfValueLimit).
//
// The rule, for every run that holds enrollment claims: each student in
// StudentId and each course in CourseId has a claim in the run that ended
// (or stands) as ClaimStatus says, and RefusedStudentIds lists the students
// whose claim the run refused or put on a waitlist. So
// `StudentId='s-1' AND ClaimStatus='confirmed'` finds exactly the runs that
// confirmed a claim of s-1. A desk run, which decides many batches, upserts
// its lists in the workflow task that closes it: the server's visibility
// task for the upsert then finds the run closed and skips it, so the close
// record carries the lists and they cost no visibility write of their own.

// DefaultAttrBytes is the Temporal server's default limit of a search
// attribute value, the bound a desk started without one keeps to.
const DefaultAttrBytes = 2000

// AttrEntryBytes is one keyword list entry encoded: the ID, its quotes and
// a comma.
func AttrEntryBytes(id string) int { return len(id) + 3 }

// keywordSet is a keyword list in first-seen order, with its encoded size.
type keywordSet struct {
	list  []string
	seen  map[string]bool
	bytes int
}

func (s *keywordSet) add(v string) {
	if s.seen[v] {
		return
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[v] = true
	s.list = append(s.list, v)
	s.bytes += AttrEntryBytes(v)
}

// with is the list's encoded size once v is in it.
func (s *keywordSet) with(v string) int {
	if s.seen[v] {
		return s.bytes
	}
	return s.bytes + AttrEntryBytes(v)
}

func (s *keywordSet) update(key temporal.SearchAttributeKeyKeywordList) temporal.SearchAttributeUpdate {
	if len(s.list) == 0 {
		return key.ValueUnset()
	}
	return key.ValueSet(s.list)
}

// ClaimList is the students and the courses of a set of enrollment claims,
// each listed once: what a run's StudentId and CourseId hold. The API's
// batcher builds a batch with it, within the bytes a desk may list; a desk
// and a batch run measure and list their claims with it.
type ClaimList struct {
	students, courses keywordSet
}

// ClaimListOf lists claims.
func ClaimListOf(claims []EnrollmentInput) ClaimList {
	var l ClaimList
	for _, c := range claims {
		l.Add(c)
	}
	return l
}

// Add lists c's student and course.
func (l *ClaimList) Add(c EnrollmentInput) {
	l.students.add(c.StudentID)
	l.courses.add(c.CourseID)
}

// Fits says whether c can join the list with both lists within budget
// bytes.
func (l *ClaimList) Fits(c EnrollmentInput, budget int) bool {
	return l.students.with(c.StudentID) <= budget && l.courses.with(c.CourseID) <= budget
}

// Len is how many distinct students the list holds.
func (l *ClaimList) Len() int { return len(l.students.list) }

// Bytes is the encoded size of the larger of the two lists.
func (l *ClaimList) Bytes() int { return max(l.students.bytes, l.courses.bytes) }

// startAttributes are the search attributes of a run started to finish
// these claims, with status as its ClaimStatus.
func (l *ClaimList) startAttributes(status EnrollmentStatus) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(
		SearchCourseID.ValueSet(l.courses.list),
		SearchStudentID.ValueSet(l.students.list),
		SearchClaimStatus.ValueSet(string(status)),
	)
}

// deskOutcome is what a desk run decided, kept as it goes and upserted as
// it closes: the students (and their courses) whose claims it confirmed,
// and the students it refused or waitlisted. A claim it answered
// "reserved" went on to a batch run of its own, whose search attributes
// list it.
type deskOutcome struct {
	confirmed ClaimList
	refused   keywordSet
	largest   int // the most bytes one batch could add to a list
}

// add records the decisions of one batch's claims.
func (o *deskOutcome) add(claims []EnrollmentInput, decisions []Decision) {
	l := ClaimListOf(claims)
	o.largest = max(o.largest, l.Bytes())
	for i, c := range claims {
		if i >= len(decisions) {
			return
		}
		switch decisions[i].Status {
		case StatusConfirmed:
			o.confirmed.Add(c)
		case StatusRefused, StatusWaitlisted:
			o.refused.add(c.StudentID)
		}
	}
}

// fits says batches can be decided here with every list still within
// budget, however their claims end.
func (o *deskOutcome) fits(budget int, batches ...DeskBatch) bool {
	students, courses := 0, 0
	for _, b := range batches {
		l := ClaimListOf(b.Claims)
		students += l.students.bytes
		courses += l.courses.bytes
	}
	return max(o.confirmed.students.bytes, o.refused.bytes)+students <= budget &&
		o.confirmed.courses.bytes+courses <= budget
}

// full says two batches as large as the run's largest might not fit in
// budget: the run closes rather than turn the batches to come away. Every
// close costs a run's start, so a run closes near its budget, not at a
// fixed share of it.
func (o *deskOutcome) full(budget int) bool {
	return max(o.confirmed.Bytes(), o.refused.bytes)+2*o.largest > budget
}

// status is the run's ClaimStatus: confirmed when it confirmed any claim
// (its StudentId lists them), else refused when it refused any, else
// handed_off (everything it reserved went on to batch runs, or it decided
// nothing).
func (o *deskOutcome) status() EnrollmentStatus {
	switch {
	case o.confirmed.Len() > 0:
		return StatusConfirmed
	case len(o.refused.list) > 0:
		return StatusRefused
	default:
		return StatusHandedOff
	}
}

// upsert sets the run's search attributes to the outcome, every key set
// or unset, in one command.
func (o *deskOutcome) upsert(ctx workflow.Context) {
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchClaimStatus.ValueSet(string(o.status())),
		o.confirmed.students.update(SearchStudentID),
		o.confirmed.courses.update(SearchCourseID),
		o.refused.update(SearchRefusedStudentIDs),
	); err != nil {
		workflow.GetLogger(ctx).Warn("upsert the desk's outcome failed", "error", err)
	}
}

// keepOutcomeFromNextRun keeps the run's outcome out of the run it
// continues as: the SDK's continue-as-new carries over the search
// attributes of the run's WorkflowInfo, and a desk's lists, tens of KB,
// would ride in the next run's start and its visibility record until an
// upsert unset them, each close costing the batch in flight
// (docs/performance.md#what-the-figures-depend-on-change-one-measure-again).
// The closed run keeps its outcome: the server writes its record from its
// own state, not from the command. On the real server, the stack test "desk
// continuing as new every 2 batches" checks the next run, and
// TestRestartLosesNothing finds the closed runs by CourseId.
func keepOutcomeFromNextRun(ctx workflow.Context) {
	//lint:ignore SA1019 continue-as-new sends this field; the SDK has no typed way to leave attributes out
	workflow.GetInfo(ctx).SearchAttributes = nil
}

// upsertClaimStatus mirrors a run's status into ClaimStatus, so operators
// can filter runs by it. A failed upsert only makes the UI filter stale; it
// must not fail the saga.
func upsertClaimStatus(ctx workflow.Context, value string) {
	if err := workflow.UpsertTypedSearchAttributes(ctx, SearchClaimStatus.ValueSet(value)); err != nil {
		workflow.GetLogger(ctx).Warn("upsert ClaimStatus failed", "error", err)
	}
}
