"""Small synthetic traces in both Alibaba formats, written here (never the real trace)."""

from __future__ import annotations

import pytest

DLRM_CSV = """\
instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,deletion_time
instance_0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,
instance_1,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,7200
instance_2,CN,app_1,32,32,0,0,0,0,64.0,64.0,100.0,100.0,-1,60,60,
instance_3,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,600.0,660.0,4260.0
instance_4,HN,app_2,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,NaN,NaN,NaN
"""

V2023_CSV = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,,0
openb-pod-0001,6000,8192,1,500,,BE,Succeeded,120,3720,180
openb-pod-0002,4000,4096,0,0,,BE,Succeeded,200,800,210
openb-pod-0003,32000,65536,8,1000,V100M32,LS,Succeeded,300,7500,300
openb-pod-0004,8000,8192,2,1000,,Burstable,Failed,60,,
"""


@pytest.fixture
def dlrm_csv() -> str:
    return DLRM_CSV


@pytest.fixture
def v2023_csv() -> str:
    return V2023_CSV
