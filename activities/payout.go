package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

// Payouts is the vendors' payout API: an HTTP endpoint (VENDOR_PAYOUT_URL)
// that pays a vendor and dedupes on the Idempotency-Key header, as payment
// providers do. Locally it is the payout simulator `claimflow dev` starts.
type Payouts struct {
	URL string
	// Client must have a timeout, so that a hanging provider becomes a
	// retry (with the same idempotency key) instead of a stuck activity.
	Client *http.Client
}

// DefaultPayoutTimeout bounds one call to the payout API.
const DefaultPayoutTimeout = 5 * time.Second

// NewPayouts returns a payout API client with a per-call timeout.
func NewPayouts(url string, timeout time.Duration) Payouts {
	if timeout <= 0 {
		timeout = DefaultPayoutTimeout
	}
	return Payouts{URL: url, Client: &http.Client{Timeout: timeout, Transport: tracing.Transport(http.DefaultTransport)}}
}

// payoutRequest is the body of a payout call.
type payoutRequest struct {
	VendorID    string `json:"vendor_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
	CouponID    string `json:"coupon_id"`
	UseID       string `json:"use_id"`
	OrderID     string `json:"order_id,omitempty"`
}

// payoutResponse is what a provider answers; only payout_id is required.
type payoutResponse struct {
	PayoutID string `json:"payout_id"`
	Status   string `json:"status"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// PayVendor pays the vendor for one use of a coupon. The idempotency key is
// derived in the workflow, so every retry of this activity (after a 5xx, a
// timeout, or a response lost after the provider processed the payment)
// carries the same key and the provider pays at most once. A 4xx answer is a
// decline: a non-retryable payout_declined refusal. 5xx, 408, 409 (the key is
// being processed), 425, 429, a timeout or a broken connection are retried on
// the workflow's payout policy.
func (a *Activities) PayVendor(ctx context.Context, in workflows.PayVendorInput) (workflows.PayVendorResult, error) {
	var res workflows.PayVendorResult
	if a.Payouts.URL == "" {
		return res, temporal.NewNonRetryableApplicationError("no payout API configured (set VENDOR_PAYOUT_URL)",
			"payout_not_configured", nil)
	}
	client := a.Payouts.Client
	if client == nil {
		client = &http.Client{Timeout: DefaultPayoutTimeout}
	}
	body, err := json.Marshal(payoutRequest{
		VendorID: in.VendorID, AmountCents: in.AmountCents, Currency: "USD", Reference: in.IdempotencyKey,
		CouponID: in.CouponID, UseID: in.UseID, OrderID: in.OrderID,
	})
	if err != nil {
		return res, fmt.Errorf("encode payout %s: %w", in.IdempotencyKey, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.Payouts.URL, bytes.NewReader(body))
	if err != nil {
		return res, temporal.NewNonRetryableApplicationError(fmt.Sprintf("payout request to %s: %v", a.Payouts.URL, err),
			"payout_not_configured", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", in.IdempotencyKey)
	resp, err := client.Do(req)
	if err != nil {
		return res, fmt.Errorf("payout %s to vendor %s: %w", in.IdempotencyKey, in.VendorID, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return res, fmt.Errorf("payout %s: read answer: %w", in.IdempotencyKey, err)
	}
	var out payoutResponse
	_ = json.Unmarshal(raw, &out) // a non-JSON answer is judged by its status alone
	reason := strings.TrimSpace(string(raw))
	if out.Error != nil {
		reason = strings.TrimSpace(out.Error.Code + ": " + out.Error.Message)
	}
	if len(reason) > 300 {
		reason = reason[:300]
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		if out.PayoutID == "" {
			return res, temporal.NewApplicationError(
				fmt.Sprintf("payout %s: provider answered %d without a payout_id", in.IdempotencyKey, code),
				workflows.ErrorTypePayoutUnavailable)
		}
		res.ProviderPayoutID = out.PayoutID
		return res, nil
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500:
		return res, temporal.NewApplicationError(
			fmt.Sprintf("payout %s: provider answered %d %s", in.IdempotencyKey, code, reason),
			workflows.ErrorTypePayoutUnavailable)
	case code >= 400:
		return res, workflows.Refuse(workflows.RefusalPayoutDeclined,
			"the vendor's payout API declined the payout (%d %s)", code, reason)
	default:
		return res, temporal.NewApplicationError(
			fmt.Sprintf("payout %s: unexpected answer %d", in.IdempotencyKey, code), workflows.ErrorTypePayoutUnavailable)
	}
}
