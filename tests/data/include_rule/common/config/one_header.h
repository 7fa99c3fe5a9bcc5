// A fixture of the dependency_rule test: config may include transport/transport.h (allowed) but
// no other header of common/transport/ (refused).
#include "common/transport/transport.h"
#include "common/transport/feature_channel.h"
