package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// couponRefusalStatus maps coupon refusals to HTTP answers. A use refused
// with payout_declined or payout_failed was compensated: the coupon is
// issued again. own_coupon_type is 403, not 409: the user is the type's
// vendor, which no change of state will make allowed.
var couponRefusalStatus = map[workflows.Refusal]int{
	workflows.RefusalSoldOut:            http.StatusConflict,
	workflows.RefusalAlreadyIssued:      http.StatusConflict,
	workflows.RefusalCouponTypeNotFound: http.StatusNotFound,
	workflows.RefusalCouponNotFound:     http.StatusNotFound,
	workflows.RefusalNotOwner:           http.StatusNotFound, // answered as coupon_not_found
	workflows.RefusalAlreadyUsed:        http.StatusConflict,
	workflows.RefusalCouponRevoked:      http.StatusConflict,
	workflows.RefusalPayoutDeclined:     http.StatusPaymentRequired,
	workflows.RefusalPayoutFailed:       http.StatusBadGateway,
	workflows.RefusalOwnCouponType:      http.StatusForbidden,
}

const (
	maxStock       = 1_000_000
	maxPayoutCents = 1_000_000_000
)

func newID(prefix string) string {
	return prefix + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
}

// ---- vendors ----

type vendor = store.Vendor

type payoutRecord = store.Payout

type createVendorRequest struct {
	ID   string  `json:"id"`
	Name *string `json:"name"`
}

func (s *server) createVendor(c *gin.Context) {
	var req createVendorRequest
	if !decodeJSON(c, &req) {
		return
	}
	if req.ID == "" {
		req.ID = newID("v-")
	}
	if !validID(c, "id", req.ID) || !validName(c, req.Name) {
		return
	}
	created, err := store.InsertVendor(c, s.db, req.ID, strings.TrimSpace(*req.Name))
	if err != nil {
		s.internalError(c, err)
		return
	}
	if !created {
		writeError(c, http.StatusConflict, "vendor_exists", "a vendor with this id already exists", "id")
		return
	}
	got, err := s.loadVendor(c, req.ID)
	if err != nil {
		s.internalError(c, err)
		return
	}
	c.JSON(http.StatusCreated, got)
}

func validName(c *gin.Context, name *string) bool { return validText(c, "name", name) }

func (s *server) getVendor(c *gin.Context) {
	got, ok := loadOwned(s, c, s.loadVendor)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, got)
}

// loadVendor returns the vendor with its balance and its latest 100 payouts.
func (s *server) loadVendor(ctx context.Context, id string) (vendor, error) {
	return store.LoadVendor(ctx, s.db, id)
}

// ---- coupon types ----

type couponType = store.CouponType

type createCouponTypeRequest struct {
	ID          string  `json:"id"`
	VendorID    string  `json:"vendor_id"`
	Name        *string `json:"name"`
	Stock       *int    `json:"stock"`
	PayoutCents *int64  `json:"payout_cents"`
}

func (s *server) createCouponType(c *gin.Context) {
	var req createCouponTypeRequest
	if !decodeJSON(c, &req) {
		return
	}
	if req.ID == "" {
		req.ID = newID("ct-")
	}
	if !validID(c, "id", req.ID) || !validID(c, "vendor_id", req.VendorID) || !validName(c, req.Name) {
		return
	}
	switch {
	case req.Stock == nil:
		writeError(c, http.StatusBadRequest, "missing_field", "stock is required", "stock")
		return
	case *req.Stock < 0 || *req.Stock > maxStock:
		writeError(c, http.StatusBadRequest, "invalid_field", "stock must be between 0 and 1000000", "stock")
		return
	case req.PayoutCents == nil:
		writeError(c, http.StatusBadRequest, "missing_field", "payout_cents is required", "payout_cents")
		return
	case *req.PayoutCents < 1 || *req.PayoutCents > maxPayoutCents:
		writeError(c, http.StatusBadRequest, "invalid_field", "payout_cents must be between 1 and 1000000000", "payout_cents")
		return
	}
	created, err := store.InsertCouponType(c, s.db, store.CouponType{ID: req.ID, VendorID: req.VendorID,
		Name: strings.TrimSpace(*req.Name), Stock: *req.Stock, PayoutCents: *req.PayoutCents})
	if errors.Is(err, store.ErrVendorNotFound) {
		writeError(c, http.StatusNotFound, "vendor_not_found", "no vendor with this id", "vendor_id")
		return
	}
	if err != nil {
		s.internalError(c, err)
		return
	}
	if !created {
		writeError(c, http.StatusConflict, "coupon_type_exists", "a coupon type with this id already exists", "id")
		return
	}
	got, err := s.loadCouponType(c, req.ID)
	if err != nil {
		s.internalError(c, err)
		return
	}
	c.JSON(http.StatusCreated, got)
}

func (s *server) getCouponType(c *gin.Context) {
	got, ok := loadByID(s, c, string(workflows.RefusalCouponTypeNotFound), "coupon type", s.loadCouponType)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, got)
}

func (s *server) loadCouponType(ctx context.Context, id string) (couponType, error) {
	return store.LoadCouponType(ctx, s.db, id)
}

// ---- coupons ----

type coupon = store.Coupon

type issueRequest struct {
	UserID string `json:"user_id"`
}

func (s *server) issueCoupon(c *gin.Context) {
	requestedAt := time.Now().UTC()
	typeID := c.Param("id")
	if !validID(c, "coupon_type_id", typeID) {
		return
	}
	var req issueRequest
	if !decodeJSON(c, &req) || !validID(c, "user_id", req.UserID) || !s.mayActFor(c, "user_id", req.UserID) {
		return
	}
	couponID, err := uuid.NewV7()
	if err != nil {
		s.internalError(c, err)
		return
	}
	// The claim's own ID names its decision update, so the run tells this
	// request from a second claim of the same user even if the update comes
	// late (workflows.IssueCouponInput.StarterUpdateID).
	in := workflows.IssueCouponInput{CouponID: couponID.String(), TypeID: typeID, UserID: req.UserID, RequestedAt: requestedAt,
		StarterUpdateID: couponID.String(), AnswerWait: s.decisionWait(workflows.ClaimIssueCoupon)}
	workflowID := workflows.IssueCouponWorkflowID(typeID, req.UserID)
	start := s.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:        workflowID,
		TaskQueue: workflows.TaskQueue,
		// A concurrent second claim of the same user joins the running run
		// (and is told already_issued); a closed run may be followed by a new one.
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			workflows.SearchCouponID.ValueSet(in.CouponID),
			workflows.SearchCouponTypeID.ValueSet(typeID),
			workflows.SearchClaimStatus.ValueSet(string(workflows.CouponPending)),
		),
	}, workflows.IssueCoupon, in)

	// The run is the claim: once it started, it decides on its own.
	d, runID, err := s.decideCoupon(c, start, workflowID, in.StarterUpdateID, workflows.ClaimIssueCoupon, true)
	if errors.Is(err, errUndecided) {
		s.answerUndecided(c, err, gin.H{"id": in.CouponID, "type_id": typeID, "user_id": req.UserID},
			couponStatusURL(in.CouponID), workflowID, runID)
		return
	}
	if err != nil {
		s.unavailable(c, fmt.Errorf("issue coupon of %s to %s: %w", typeID, req.UserID, err))
		return
	}
	s.metrics.decided("IssueCoupon", string(d.Status), string(d.Refusal))
	if d.Status == workflows.CouponFailed {
		s.internalError(c, fmt.Errorf("issue coupon of %s to %s: %s", typeID, req.UserID, d.Message))
		return
	}
	if d.Status == workflows.CouponRefused {
		body := refusalBody(d)
		if d.Refusal == workflows.RefusalAlreadyIssued && d.CouponID != "" {
			body["coupon_id"] = d.CouponID
		}
		c.AbortWithStatusJSON(couponStatusOf(d.Refusal), body)
		return
	}
	c.JSON(http.StatusCreated, coupon{
		ID: d.CouponID, TypeID: typeID, UserID: req.UserID, Status: string(d.Status),
		WorkflowID: workflowID, RunID: runID, WorkflowURL: s.runURL(workflowID, runID),
	})
}

type useRequest struct {
	UserID  string `json:"user_id"`
	OrderID string `json:"order_id"`
}

// useAnswer is the 200 answer of a use.
type useAnswer struct {
	Status      string        `json:"status"`
	CouponID    string        `json:"coupon_id"`
	UseID       string        `json:"use_id"`
	UserID      string        `json:"user_id"`
	OrderID     string        `json:"order_id,omitempty"`
	Payout      *payoutRecord `json:"payout"`
	WorkflowID  string        `json:"workflow_id"`
	RunID       string        `json:"run_id"`
	WorkflowURL string        `json:"workflow_url,omitempty"`
}

func (s *server) useCoupon(c *gin.Context) {
	requestedAt := time.Now().UTC()
	couponID := c.Param("id")
	if !validID(c, "coupon_id", couponID) {
		return
	}
	var req useRequest
	if !decodeJSON(c, &req) || !validID(c, "user_id", req.UserID) || !s.mayActFor(c, "user_id", req.UserID) {
		return
	}
	if req.OrderID != "" && !validID(c, "order_id", req.OrderID) {
		return
	}
	// Ownership is decided here, from the database, before any run starts:
	// a coupon that is not the user's is answered as a missing one. The
	// rest of admission (already_used, revoked) is the run's to decide:
	// the read below only names the coupon's type and vendor in the run's
	// search attributes. Concurrent uses of one coupon, from this API or
	// another replica, meet in its running run (USE_EXISTING below) and only
	// one takes it (MarkCouponUsed's conditional UPDATE). Where concurrent
	// updates of one run trip temporalio/temporal#7741 (an update left
	// unaccepted until its deadline), the request gets 503 with
	// Retry-After; a retry carries a new use ID and is told the outcome.
	owner, ok := s.authorizeOwner(c, "coupon_id", couponID)
	if !ok {
		return
	}
	if owner != req.UserID {
		// An admin acting for someone who does not hold the coupon.
		ownerRules[ownerCoupon].notFoundAnswer(c, "coupon_id")
		return
	}
	current, err := s.loadCoupon(c, couponID)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(c, http.StatusNotFound, string(workflows.RefusalCouponNotFound), "no coupon with this id", "coupon_id")
		return
	}
	if err != nil {
		s.internalError(c, err)
		return
	}
	if current.VendorID == owner {
		// The run's MarkCouponUsed refuses it too; the rows read above
		// already tell, so no run starts.
		writeError(c, http.StatusForbidden, string(workflows.RefusalOwnCouponType),
			"a vendor may not use a coupon of its own coupon type", "user_id")
		return
	}
	useID, err := uuid.NewV7()
	if err != nil {
		s.internalError(c, err)
		return
	}
	ureq := workflows.UseRequest{UseID: useID.String(), UserID: req.UserID, OrderID: req.OrderID, RequestedAt: requestedAt}
	workflowID := workflows.UseCouponWorkflowID(couponID)
	start := s.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:        workflowID,
		TaskQueue: workflows.TaskQueue,
		// Every request to use this coupon meets in the running run; once it
		// closed (used, or compensated) a new request starts a new one.
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			workflows.SearchCouponID.ValueSet(couponID),
			workflows.SearchCouponTypeID.ValueSet(current.TypeID),
			workflows.SearchVendorID.ValueSet(current.VendorID),
			workflows.SearchClaimStatus.ValueSet(string(workflows.CouponPending)),
		),
	}, workflows.UseCoupon, workflows.UseCouponInput{CouponID: couponID, Request: ureq,
		PayoutTimeout: s.cfg.PayoutTimeout, AnswerWait: s.decisionWait(workflows.ClaimUseCoupon)})

	// A use decides only after its payout policy has run its course, so it
	// waits as long as the workflow's own options allow (decisionWait). The
	// use request is the update, so it goes on only once the run accepted it.
	d, runID, err := s.decideCoupon(c, start, workflowID, "", workflows.ClaimUseCoupon, false, ureq)
	if errors.Is(err, errUndecided) {
		s.answerUndecided(c, err, gin.H{"coupon_id": couponID, "use_id": ureq.UseID, "user_id": req.UserID},
			couponStatusURL(couponID), workflowID, runID)
		return
	}
	if err != nil {
		s.unavailable(c, fmt.Errorf("use coupon %s for %s: %w", couponID, req.UserID, err))
		return
	}
	s.metrics.decided("UseCoupon", string(d.Status), string(d.Refusal))
	switch d.Status {
	case workflows.CouponFailed:
		s.internalError(c, fmt.Errorf("use coupon %s for %s: %s", couponID, req.UserID, d.Message))
		return
	case workflows.CouponRefused:
		answerUseRefusal(c, couponID, d)
		return
	}
	answer := useAnswer{
		Status: string(d.Status), CouponID: couponID, UseID: d.UseID, UserID: req.UserID, OrderID: req.OrderID,
		WorkflowID: workflowID, RunID: runID, WorkflowURL: s.runURL(workflowID, runID),
	}
	if p := d.Payout; p != nil {
		answer.Payout = &payoutRecord{
			LedgerID: p.LedgerID, IdempotencyKey: p.IdempotencyKey, CouponID: couponID, UseID: d.UseID,
			VendorID: p.VendorID, AmountCents: p.AmountCents, ProviderPayoutID: p.ProviderPayoutID, RecordedAt: p.RecordedAt,
		}
		if req.OrderID != "" {
			answer.Payout.OrderID = &req.OrderID
		}
	}
	c.JSON(http.StatusOK, answer)
}

func answerUseRefusal(c *gin.Context, couponID string, d workflows.CouponDecision) {
	if d.Refusal == workflows.RefusalNotOwner {
		// The handler's owner check answers this before a run starts; should
		// a run still say it, the answer is the same: no such coupon.
		ownerRules[ownerCoupon].notFoundAnswer(c, "coupon_id")
		return
	}
	body := refusalBody(d)
	body["coupon_id"] = couponID
	if d.Refusal == workflows.RefusalPayoutDeclined || d.Refusal == workflows.RefusalPayoutFailed {
		// Compensated: the coupon is the user's and unused again.
		body["use_id"] = d.UseID
		body["coupon_status"] = string(workflows.CouponIssued)
	}
	c.AbortWithStatusJSON(couponStatusOf(d.Refusal), body)
}

func refusalBody(d workflows.CouponDecision) gin.H {
	return gin.H{"error": apiError{Code: string(d.Refusal), Message: d.Message}}
}

func couponStatusOf(r workflows.Refusal) int {
	if status, ok := couponRefusalStatus[r]; ok {
		return status
	}
	return http.StatusConflict
}

// decideCoupon starts (or joins) a coupon run and waits, up to decisionWait
// of kind, for its decision update; args are the update's arguments
// (decideClaim).
func (s *server) decideCoupon(c *gin.Context, start client.WithStartWorkflowOperation, workflowID, updateID string,
	kind workflows.ClaimKind, startIsClaim bool, args ...any) (workflows.CouponDecision, string, error) {
	return decideClaim[workflows.CouponDecision](c.Request.Context(), s.temporal, start, workflowID, updateID,
		s.decisionWait(kind), startIsClaim, args...)
}

// couponStatusURL is where a coupon's outcome can be read.
func couponStatusURL(id string) string { return "/v1/coupons/" + url.PathEscape(id) }

func (s *server) getCoupon(c *gin.Context) {
	got, ok := loadOwned(s, c, s.loadCoupon)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, got)
}

func (s *server) loadCoupon(ctx context.Context, id string) (coupon, error) {
	k, err := store.LoadCoupon(ctx, s.db, id)
	if err != nil {
		return k, err
	}
	k.WorkflowURL = s.runURL(k.WorkflowID, k.RunID)
	if k.UseWorkflowID != nil && k.UseRunID != nil {
		k.UseWorkflowURL = s.runURL(*k.UseWorkflowID, *k.UseRunID)
	}
	return k, nil
}
