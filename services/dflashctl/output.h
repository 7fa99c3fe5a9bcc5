// Human tables and JSON renderings of runs, events and workers for dflashctl.
#pragma once

#include <string>
#include <vector>

#include "dflash/v1/common.pb.h"

namespace google::protobuf {
class Message;
}

namespace dflash::ctl {

// Proto -> JSON with the .proto field names, all fields present.
std::string ToJson(const google::protobuf::Message& m);
std::string RunsTable(const std::vector<v1::RunStatus>& runs);
std::string RunDetails(const v1::RunStatus& run);
std::string DataLines(const v1::DataSummary& data);
std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers);
// An acceptance-length measurement: tau, throughput, acceptance by block position.
std::string EvalTable(const v1::EvalResult& r);
std::string EventLine(const v1::RunEvent& e);
std::string FormatBytes(uint64_t bytes);

}  // namespace dflash::ctl
