package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// What a desk run tells an operator's visibility query, by the rule of
// batchOutcome: `StudentId='s-1' AND ClaimStatus='confirmed'` finds the
// runs that confirmed a claim of s-1, `RefusedStudentIds='s-1'` those that
// refused one. A desk decides many batches, so it keeps the outcome of
// each as it goes and upserts the lot in the workflow task that closes the
// run (continue-as-new or an operator's cancel): like a batch run's final
// upsert, it costs no visibility write beyond the close. So that the lists
// stay within the server's size limit of a search attribute value, a desk
// continues as new once two of its largest batches might no longer fit,
// refuses (in its update validator) a batch that might not fit, and
// continues as new at most
// deskDiscloseWithin after its first decision, which bounds how long a
// decision is missing from visibility.

// deskOutcomeChangeID versions the desk's outcome: desk runs recorded
// before it replay without its commands.
const deskOutcomeChangeID = "desk-search-attributes"

// deskDiscloseWithin bounds the time from a desk run's first decision to
// its close, where its decisions reach visibility.
const deskDiscloseWithin = 5 * time.Second

// DeskFullErrorType is the type of the error a desk rejects a batch with
// when the batch might not fit in its search attributes; the sender
// decides the batch in a run of its own instead.
const DeskFullErrorType = "DeskFull"

// DefaultAttrBytes is the Temporal server's default limit of a search
// attribute value (frontend.searchAttributesSizeOfValueLimit), the bound a
// desk started without one keeps to.
const DefaultAttrBytes = 2000

// AttrEntryBytes is one keyword list entry encoded: the ID, its quotes and
// a comma. The batcher and the desk measure their lists by it.
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

func (s *keywordSet) update(key temporal.SearchAttributeKeyKeywordList) temporal.SearchAttributeUpdate {
	if len(s.list) == 0 {
		return key.ValueUnset()
	}
	return key.ValueSet(s.list)
}

// deskOutcome is the outcome of the batches a desk run decided.
type deskOutcome struct {
	confirmed keywordSet // StudentId: students with a claim confirmed here
	courses   keywordSet // CourseId: the courses of those claims
	refused   keywordSet // RefusedStudentIds: refused or waitlisted here
	largest   int        // the most bytes one batch could add to a list
}

// add records the decisions of one batch's claims. A reserved claim went
// on to a batch run of its own, whose search attributes tell its fate; a
// claim left undecided has no fate here either.
func (o *deskOutcome) add(claims []EnrollmentInput, decisions []Decision) {
	students, courses := listBytes(claims)
	o.largest = max(o.largest, students, courses)
	for i, c := range claims {
		if i >= len(decisions) {
			return
		}
		switch decisions[i].Status {
		case StatusConfirmed:
			o.confirmed.add(c.StudentID)
			o.courses.add(c.CourseID)
		case StatusRefused, StatusWaitlisted:
			o.refused.add(c.StudentID)
		}
	}
}

// status is the run's ClaimStatus: confirmed when it confirmed any claim
// (its StudentId lists them), else refused when it refused any, else
// handed_off (everything it reserved went on to runs of their own, or it
// decided nothing).
func (o *deskOutcome) status() EnrollmentStatus {
	switch {
	case len(o.confirmed.list) > 0:
		return StatusConfirmed
	case len(o.refused.list) > 0:
		return StatusRefused
	default:
		return StatusHandedOff
	}
}

// full says two batches as large as the run's largest might not fit in
// budget: the run should close rather than reject the batches to come. A
// run closes at a lists' size near budget (the batches of a 2,000/s burst
// add about a kilobyte each), not at a fixed fraction of it: every close
// costs a run's start and the retry of a batch that meets it closing.
func (o *deskOutcome) full(budget int) bool {
	return max(o.confirmed.bytes, o.courses.bytes, o.refused.bytes)+2*o.largest > budget
}

// listBytes is the encoded size of one batch's students and of its
// courses, each listed once: the most it can add to each list.
func listBytes(claims []EnrollmentInput) (students, courses int) {
	var s, c keywordSet
	for _, claim := range claims {
		s.add(claim.StudentID)
		c.add(claim.CourseID)
	}
	return s.bytes, c.bytes
}

// fits says batches can be decided here with every list still within
// budget, however their claims end.
func (o *deskOutcome) fits(budget int, batches ...EnrollmentBatchInput) bool {
	students, courses := 0, 0
	for _, b := range batches {
		s, c := listBytes(b.Claims)
		students += s
		courses += c
	}
	return max(o.confirmed.bytes, o.refused.bytes)+students <= budget && o.courses.bytes+courses <= budget
}

// upsert sets the run's search attributes to the outcome, every key set
// or unset, in one command.
func (o *deskOutcome) upsert(ctx workflow.Context) {
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchClaimStatus.ValueSet(string(o.status())),
		o.confirmed.update(SearchStudentID),
		o.courses.update(SearchCourseID),
		o.refused.update(SearchRefusedStudentIDs),
	); err != nil {
		workflow.GetLogger(ctx).Warn("upsert the desk's outcome failed", "error", err)
	}
}

// clearInherited unsets the outcome a run continued from its previous run
// (continue-as-new carries the search attributes over), so that only the
// run that decided a claim tells it.
func clearInherited(ctx workflow.Context) {
	sa := workflow.GetTypedSearchAttributes(ctx)
	keys := []temporal.SearchAttributeKey{SearchClaimStatus, SearchStudentID, SearchCourseID, SearchRefusedStudentIDs}
	inherited := false
	for _, k := range keys {
		inherited = inherited || sa.ContainsKey(k)
	}
	if !inherited {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchClaimStatus.ValueUnset(), SearchStudentID.ValueUnset(),
		SearchCourseID.ValueUnset(), SearchRefusedStudentIDs.ValueUnset(),
	); err != nil {
		workflow.GetLogger(ctx).Warn("clear the search attributes of the previous desk run failed", "error", err)
	}
}
