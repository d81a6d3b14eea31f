package execd

import (
	"net/http"

	"github.com/opensandbox/opensandbox/internal/httpx"
)

// errTODO marks routes whose implementation lands in a following change.
var errTODO = httpx.Errorf(http.StatusNotImplemented, "NOT_SUPPORTED", "not implemented yet")
