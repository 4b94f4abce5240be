package workflows

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.temporal.io/sdk/workflow"
)

// BatchStartSummary is what the Web UI shows on a batch run's page: a
// one-line summary and markdown details, for the StaticSummary and
// StaticDetails start options of whoever starts the run (the API's
// batcher). They travel in the start request, so they cost no visibility
// write. What the run decides (reserved, refused) is in its current
// details (batchCurrentDetails), which the UI asks the run for.
func BatchStartSummary(claims []EnrollmentInput) (summary, details string) {
	perCourse := map[string]int{}
	students := map[string]bool{}
	for _, c := range claims {
		perCourse[c.CourseID]++
		students[c.StudentID] = true
	}
	courses := slices.Sorted(maps.Keys(perCourse))
	summary = fmt.Sprintf("enrollment batch: %d claims, %d students, %d courses", len(claims), len(students), len(courses))
	var b strings.Builder
	fmt.Fprintf(&b, "**%d claims** of %d students on %d courses; the run's current details and result say how many were reserved and refused.\n\n",
		len(claims), len(students), len(courses))
	b.WriteString("| course | claims |\n|---|---|\n")
	for _, c := range courses {
		fmt.Fprintf(&b, "| %s | %d |\n", c, perCourse[c])
	}
	return summary, b.String()
}

// batchCurrentDetails is the run's own account, for the Web UI: served by
// the SDK's metadata query, it costs no history event and no visibility
// write.
func batchCurrentDetails(ctx workflow.Context, s BatchState, decisions []Decision) {
	refusals := map[Refusal]int{}
	for _, d := range decisions {
		if d.Status == StatusRefused {
			refusals[d.Refusal]++
		}
	}
	var why []string
	for _, r := range slices.Sorted(maps.Keys(refusals)) {
		why = append(why, fmt.Sprintf("%s ×%d", r, refusals[r]))
	}
	text := fmt.Sprintf("**%s** — %d claims: %d reserved, %d refused", s.Status, s.Claims, s.Reserved, s.Refused)
	if len(why) > 0 {
		text += " (" + strings.Join(why, ", ") + ")"
	}
	if len(s.HandedOff) > 0 {
		text += fmt.Sprintf("; %d handed off to Enrollment runs of their own", len(s.HandedOff))
	}
	workflow.SetCurrentDetails(ctx, text)
}
