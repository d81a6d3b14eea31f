package vault

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// ParseCreate decodes the body of POST /credential-vault strictly: an
// unknown field, trailing data or an empty body is invalid. It checks
// only the JSON; Create checks the request. Errors wrap egress.ErrInvalid.
func ParseCreate(data []byte) (api.CredentialVaultCreateRequest, error) {
	var req api.CredentialVaultCreateRequest
	err := decodeStrict(data, &req)
	return req, err
}

// ParseMutation decodes the body of PATCH /credential-vault strictly, as
// ParseCreate does. Errors wrap egress.ErrInvalid.
func ParseMutation(data []byte) (api.CredentialVaultMutationRequest, error) {
	var req api.CredentialVaultMutationRequest
	err := decodeStrict(data, &req)
	return req, err
}

// decodeStrict decodes one JSON object into v, refusing unknown fields
// and anything after the object. The errors of encoding/json name a
// field or an offset, never a value.
func decodeStrict(data []byte, v any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return invalid("empty body: want a JSON object")
	}
	if data[0] != '{' {
		return invalid("decode JSON: want an object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("decode JSON: %v", jsonError(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("decode JSON: data after the object")
	}
	return nil
}

// jsonError returns the text of a decoding error without the value that
// caused it: a type error names the field and the JSON type only.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "(top level)"
		}
		kind, _, _ := strings.Cut(te.Value, " ") // "number 12345": the kind only
		return "field " + field + ": cannot use a JSON " + kind + " here"
	}
	return err.Error()
}
