package api

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// SignHS256 mints the kind of token NewHS256 accepts, for the local stack
// and the tools that call it (`claimflow token`, tests, the bench): sub is
// the student or user ID, role is RoleAdmin for operators or "" for a
// student; issuer and audience, when not empty, go into the token.
func SignHS256(secret, sub, role string, ttl time.Duration, issuer, audience string) (string, error) {
	if len(secret) < MinHS256SecretBytes {
		return "", fmt.Errorf("the HS256 secret must be at least %d bytes", MinHS256SecretBytes)
	}
	if sub == "" {
		return "", errors.New("a token needs a subject")
	}
	if ttl <= 0 {
		return "", errors.New("a token needs a positive lifetime")
	}
	now := time.Now()
	claims := struct {
		Role string `json:"role,omitempty"`
		jwt.RegisteredClaims
	}{
		Role: role,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   sub,
			Issuer:    issuer,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	if audience != "" {
		claims.Audience = jwt.ClaimStrings{audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
}
